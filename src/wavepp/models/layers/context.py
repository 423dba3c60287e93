"""What every layer of one stage forward reads, in one record passed down the layers."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wavepp.models.batch import StageBatch
from wavepp.models.kernels import Kernels
from wavepp.models.paged_pools import PagedPools


@dataclass
class ForwardContext:
    batch: StageBatch  # the chunks, their positions and cache slots
    cache: PagedPools  # this stage's pools, written in place by the layers
    kernels: Kernels  # the paths every projection and attention call takes
    cos: torch.Tensor | None  # RoPE of the batch's positions: [num_tokens, 1, rope_dim / 2]
    sin: torch.Tensor | None
    # DSA: the selection of the last layer that ran an indexer ([num_tokens, index_topk]), which
    # a "shared" layer after it attends over; carried from layer to layer (and across a stage
    # boundary with the activations, `StageModel`)
    topk: torch.Tensor | None = None
