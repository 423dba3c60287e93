"""MiniMax-M2, DeepSeek-V3 and GLM-5 stage models against transformers' own model code.

Every test compares fp32 logits of every computed position with transformers' full forward
on the same weights, within 1e-4 absolute: both sides compute in fp32 and differ only in
summation order (experts grouped instead of one at a time, attention per chunk over the
paged context, MLA expanded per chunk), which moves logits of magnitude ~5 by ~3e-6 here;
a wrong expert, mask, rotation or cache row moves them by 1e-2 or more.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from tests.models.conftest import random_prompt
from wavepp.models import ChunkSpec, StageBatch, load_model_config, load_stage_model, stage_specs
from wavepp.models.kernels import Kernels, cpp
from wavepp.random_checkpoint import MOE_ARCHS

FP32_ATOL = 1e-4
BLOCK_SIZE = 4


_REFERENCES: dict = {}


def reference_logits(path, token_ids: list[int]) -> torch.Tensor:
    """transformers' logits at every position: [len, vocab] fp32."""
    import transformers

    if str(path) not in _REFERENCES:
        transformers.logging.set_verbosity_error()
        _REFERENCES[str(path)] = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32
        ).eval()
    with torch.no_grad():
        return _REFERENCES[str(path)](torch.tensor([token_ids])).logits[0].float()


class Stages:
    """The stage slices of a model chained in-process, each with its own pools; the test
    chooses block tables, so requests can share cached prefix blocks."""

    def __init__(
        self, path, num_stages: int, num_blocks: int = 32, kernels: Kernels | None = None
    ) -> None:
        config = load_model_config(path)
        self.models = [
            load_stage_model(path, spec, torch.float32)
            for spec in stage_specs(config.num_layers, num_stages)
        ]
        self.caches = [model.new_kv_cache(num_blocks, BLOCK_SIZE) for model in self.models]
        self.kernels = kernels

    def run(self, chunks: list[ChunkSpec], token_ids: list[int]) -> torch.Tensor:
        """One wave; logits of every token of the batch [num_tokens, vocab]."""
        batch = StageBatch.build(chunks, BLOCK_SIZE)
        out = self.models[0](
            batch,
            self.caches[0],
            input_ids=torch.tensor(token_ids),
            all_logits=len(self.models) == 1,
            kernels=self.kernels,
        )
        for index, (model, cache) in enumerate(zip(self.models[1:], self.caches[1:]), start=2):
            assert out.shape[1] == model.input_width
            out = model(
                batch,
                cache,
                hidden_states=out,
                all_logits=index == len(self.models),
                kernels=self.kernels,
            )
        return out


def _prefix_reuse_scenario(path, num_stages: int, kernels: Kernels | None = None) -> None:
    """Request a: 37 tokens in 4 chunks, each over a.'s cached prefix. Then one wave with
    b, which shares a's first 5 blocks (20 tokens, a cache hit) and computes 10 more, and c,
    cold; then b's last 5 tokens. Every computed position is checked. `kernels`: the paths
    every stage runs (None: the defaults)."""
    stages = Stages(path, num_stages, kernels=kernels)
    a = random_prompt(37, seed=21)
    b = a[:20] + random_prompt(15, seed=22)
    c = random_prompt(9, seed=23)
    table_a = tuple(range(10))
    table_b = table_a[:5] + (17, 11, 30, 12)  # shared prefix blocks, then scattered ones
    table_c = (20, 14, 29)
    expected = {
        name: reference_logits(path, prompt) for name, prompt in (("a", a), ("b", b), ("c", c))
    }
    start = 0
    for end in (13, 14, 25, 37):
        logits = stages.run([ChunkSpec(start, end - start, table_a, "a")], a[start:end])
        torch.testing.assert_close(logits, expected["a"][start:end], atol=FP32_ATOL, rtol=0)
        start = end
    logits = stages.run(
        [ChunkSpec(20, 10, table_b, "b"), ChunkSpec(0, 9, table_c, "c")], b[20:30] + c
    )
    torch.testing.assert_close(logits[:10], expected["b"][20:30], atol=FP32_ATOL, rtol=0)
    torch.testing.assert_close(logits[10:], expected["c"], atol=FP32_ATOL, rtol=0)
    logits = stages.run([ChunkSpec(30, 5, table_b, "b")], b[30:])
    torch.testing.assert_close(logits, expected["b"][30:], atol=FP32_ATOL, rtol=0)


@pytest.mark.parametrize("num_stages", [1, 2, 3])
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_stages_with_chunks_and_prefix_hits_match_transformers(moe_models, arch, num_stages):
    _prefix_reuse_scenario(moe_models[arch], num_stages)


@contextmanager
def stable_topk():
    """Make transformers break top-k ties toward the lower index, as wavepp's DSA indexer
    does (a stable sort), and record the indexer's score rows ([1, S, T] inputs of topk)."""
    original = torch.Tensor.topk
    recorded = []

    def topk(self, k, dim=-1, largest=True, sorted=True):
        if self.dim() == 3:
            recorded.append(self.detach().clone())
        indices = torch.sort(self, dim=dim, descending=largest, stable=True).indices.narrow(
            dim, 0, k
        )
        return torch.return_types.topk((self.gather(dim, indices), indices))

    torch.Tensor.topk = topk
    try:
        yield recorded
    finally:
        torch.Tensor.topk = original


@pytest.mark.parametrize("num_stages", [1, 2, 3])
def test_dsa_small_topk_matches_transformers_tie_aware(moe_models, num_stages):
    """index_topk = 4 of up to 37 keys. ReLU scores tie (exactly 0.0) at the 4th key for many
    queries, and which tied key is kept is the implementation's choice (transformers' CPU topk
    picks its own way). wavepp keeps the lower positions; with transformers made to do the
    same, every computed position must match."""
    path = moe_models["glm_moe_dsa/topk4"]
    a = random_prompt(37, seed=21)
    _REFERENCES.pop(str(path), None)
    with stable_topk() as scores:
        reference_logits(path, a)
    # the test is only meaningful if ties do cross the 4th place somewhere
    ties = 0
    for rows in scores:
        ranked = rows[0].sort(dim=-1, descending=True).values
        ties += int(((ranked[4:, 3] == ranked[4:, 4]) & ranked[4:, 3].isfinite()).sum())
    assert ties > 0
    with stable_topk():
        _prefix_reuse_scenario(path, num_stages)


def test_indexer_keys_have_their_own_pool_on_full_layers_only(moe_models):
    """GLM-5 tiny: layers full, full, shared, full. Split in two, stage 1 owns layers 2-3:
    latent rows on both, indexer keys on layer 3 only, and its input carries the top-k of
    layer 1 (layer 2 shares it): hidden 64 + 64 int32 columns."""
    config = load_model_config(moe_models["glm_moe_dsa"])
    assert config.indexer_types == ("full", "full", "shared", "full")
    first, second = (
        load_stage_model(moe_models["glm_moe_dsa"], spec, torch.float32)
        for spec in stage_specs(4, 2)
    )
    cache = second.new_kv_cache(8, BLOCK_SIZE)
    assert {name: list(t.shape) for name, t in cache.tensors.items()} == {
        "latent": [2, 8, 4, 16 + 8],
        "index_key": [1, 8, 4, 16],
    }
    assert (first.output_width, second.input_width, second.output_width) == (64 + 64, 64 + 64, 64)
    bf16 = load_stage_model(moe_models["glm_moe_dsa"], stage_specs(4, 2)[1], torch.bfloat16)
    assert bf16.input_width == 64 + 128  # int32 bits in two bf16 columns each


@pytest.mark.parametrize("arch", [*MOE_ARCHS, "glm_moe_dsa/topk4"])
def test_bf16_stage_splits_agree_bit_for_bit(moe_models, arch):
    """In bf16, PP = 2 and 3 compute exactly what PP = 1 does (the DSA top-k crosses the
    boundary as int32 bits in bf16 columns, losslessly), and stay near the fp32 reference:
    the greedy token of each chunk is the reference's whenever the reference's top two are
    more than 0.2 apart in logprob (bf16 moves logprobs by a few hundredths over 4 layers).
    With 4 of 37 keys kept, bf16 rounding changes which keys the indexer keeps, so the
    small-top-k model is held to the bit-for-bit agreement only."""
    from wavepp.models import LocalPipeline

    prompt = random_prompt(37, seed=31)
    chunks = [13, 11, 13]
    runs = []
    for num_stages in (1, 2, 3):
        pipe = LocalPipeline(
            moe_models[arch],
            num_stages=num_stages,
            dtype=torch.bfloat16,
            num_blocks=16,
            block_size=BLOCK_SIZE,
        )
        start, logits = 0, []
        for size in chunks:
            logits.append(pipe.prefill_chunks([("r", prompt[start : start + size])])[0])
            start += size
        runs.append(torch.stack(logits))
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])
    if arch.endswith("topk4"):
        return
    with stable_topk():
        reference = reference_logits(moe_models[arch], prompt)[[12, 23, 36]].log_softmax(-1)
    for got, expected in zip(runs[0].log_softmax(-1), reference):
        best, runner_up = expected.topk(2).values
        if best - runner_up > 0.2:
            assert int(got.argmax()) == int(expected.argmax())
        assert abs(float(got.max()) - float(best)) < 0.1


@pytest.mark.parametrize("arch", ["deepseek_v3", "glm_moe_dsa"])
def test_yarn_rope_scaling_matches_transformers(moe_models, tmp_path, arch):
    """YaRN as the released DeepSeek-V3 configures it (here over an original context of 16
    positions, so the prompts run past it): scaled frequencies, cos/sin scaled by
    mscale / mscale_all_dim, softmax scale by mscale_all_dim's factor squared."""
    import json
    import shutil

    path = shutil.copytree(moe_models[arch], tmp_path / arch)
    config = json.loads((path / "config.json").read_text())
    config["rope_parameters"] = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 0.8,
        "mscale_all_dim": 1.0,
    }
    (path / "config.json").write_text(json.dumps(config))
    assert load_model_config(path).rope_scaling.factor == 4.0
    _prefix_reuse_scenario(path, num_stages=2)


def test_mla_without_q_lora_matches_transformers(tmp_path):
    """DeepSeek-V3 layout with q_lora_rank null (q_proj straight from the hidden state)."""
    from wavepp.random_checkpoint import make_model

    path = make_model(tmp_path / "ds", arch="deepseek_v3", seed=4, num_layers=3, q_lora_rank=0)
    assert load_model_config(path).q_lora_rank == 0
    _prefix_reuse_scenario(path, num_stages=3)


def test_moe_runs_one_matmul_pair_per_active_expert(moe_models, monkeypatch):
    """48 tokens, top-2 of 8 experts: one gate/up matmul per expert that got tokens (its down
    matmul is a torch.mm), however many tokens it got; the result is transformers' MoE block's."""
    from wavepp.models.kernels import Kernels

    stage = load_stage_model(moe_models["minimax_m2"], dtype=torch.float32)
    block = stage.layers[1].mlp
    x = torch.randn(48, 64, generator=torch.Generator().manual_seed(3))
    calls = []

    class Counting(Kernels):
        def project(self, inputs, weight, bias=None):  # every projection of the MoE block
            calls.append(inputs.shape[0])
            return super().project(inputs, weight, bias)

    active = torch.unique(block.router(x, Kernels())[1]).numel()
    out = block(x, Counting())
    assert len(calls) == 1 + active  # the router's logits, then one per active expert
    assert sum(calls[1:]) == 48 * 2  # every (token, expert) pair exactly once
    reference_logits(moe_models["minimax_m2"], [0])
    hf_block = _REFERENCES[str(moe_models["minimax_m2"])].model.layers[1].mlp
    with torch.no_grad():
        torch.testing.assert_close(out, hf_block(x[None])[0], atol=1e-5, rtol=0)


@pytest.mark.skipif(
    cpp.amx_attention_kernels() is None,
    reason="no AMX-BF16 on this CPU: the latent form runs on the AMX attention kernel only",
)
def test_mla_latent_form_on_amx_close_to_fp32_reference(moe_models, monkeypatch):
    """DeepSeek-V3's MLA layers (no DSA) in bf16 with the `amx` kernel attend in latent form
    (each head's query absorbed into the latent space, one KV head read from the cache in
    place): every layer takes that path, and each chunk's logprobs stay near the fp32
    reference (the bf16 test's criteria) and near the MHA form's in bf16."""
    from wavepp.models import LocalPipeline
    from wavepp.models.layers.mla import MLAttention

    calls = []
    latent = MLAttention._latent_attention
    monkeypatch.setattr(
        MLAttention,
        "_latent_attention",
        lambda self, *a: calls.append(self.layer) or latent(self, *a),
    )
    prompt = random_prompt(37, seed=31)
    runs = {}
    for attention in ("chunked", "amx"):
        pipe = LocalPipeline(
            moe_models["deepseek_v3"],
            dtype=torch.bfloat16,
            num_blocks=16,
            block_size=BLOCK_SIZE,
            kernels=Kernels(attention=attention),
        )
        start, logits = 0, []
        for size in (13, 11, 13):
            logits.append(
                pipe.prefill_chunks([("r", prompt[start : start + size])])[0]
                .float()
                .log_softmax(-1)
            )
            start += size
        runs[attention] = torch.stack(logits)
    num_layers = load_model_config(moe_models["deepseek_v3"]).num_layers
    assert sorted(set(calls)) == list(range(num_layers)) and len(calls) == 3 * num_layers
    reference = reference_logits(moe_models["deepseek_v3"], prompt)[[12, 23, 36]].log_softmax(-1)
    for got, mha, expected in zip(runs["amx"], runs["chunked"], reference):
        best, runner_up = expected.topk(2).values
        if best - runner_up > 0.2:
            assert int(got.argmax()) == int(expected.argmax())
        assert abs(float(got.max()) - float(best)) < 0.1
        top = expected.topk(5).indices
        assert (got[top] - mha[top]).abs().max() < 0.1
