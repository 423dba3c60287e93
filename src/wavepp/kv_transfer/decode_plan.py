"""What a decode engine may load of a transfer: the decision its connector makes, engine-free.

    plan_load(store, transfer_id, prompt, ...) -> LoadPlan(num_tokens, reason)    directory store
    plan_arena(params, prompt, ...) -> LoadPlan(num_tokens, reason)     Mooncake: the stages' arenas

    num_tokens > 0   load prompt tokens [num_computed, num_computed + num_tokens)
    num_tokens == 0  load nothing: compute the prompt (`reason` says why, for the log and the
                     miss counter: missing, failed, corrupt, another prompt or model), or
                     nothing is left past what the engine has cached itself
    num_tokens None  the stages are still writing: ask again (until the caller's wait runs out)

A decode engine computes at least the prompt's last token (it needs its logits): every other
token loads, `len(prompt) - 1` of them, whatever the engine's block size (its last block partly
filled, as vLLM's NIXL path loads it).

Over the transfer engine (`plan_arena`) the decision is made from the params alone, with no
network on the scheduler's thread: the prompt's digest, every stage's location well formed,
the layers, pools and widths this engine's. Whether the parts are still there is learned by the
pull (mooncake/puller.py); a pull that fails is the worker's to report (vLLM recomputes those
blocks).

The engine names the pools its layers take and their row width: an attention layer's `key` and
`value` (kv heads x head dim each), or MLA's one `latent` pool (kv_lora_rank + qk_rope_head_dim);
a transfer of other pools or widths is another model's and is refused.

`DecodePlanner` is the connector's scheduler side around it, per request: the transfer is read
and its checksums verified once per request, however often the engine asks (vLLM asks again
each step a request waits: no room for it yet, or the stages still writing), and the decision
kept until the request loads or ends.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from wavepp.kv_transfer.directory.store import DirectoryStore, Transfer, TransferError
from wavepp.kv_transfer.mooncake.part import check_location, prompt_digest

log = logging.getLogger("wavepp.connectors.vllm")


@dataclass(frozen=True)
class LoadPlan:
    num_tokens: int | None
    reason: str = ""


KV_POOLS = ("key", "value")  # an attention layer's pools
LATENT_POOLS = ("latent",)  # an MLA layer's


def plan_load(
    store: DirectoryStore,
    transfer_id,
    prompt: list[int],
    *,
    block_size: int,
    num_computed: int,
    num_layers: int,
    kv_width: int,
    pools: Sequence[str] = KV_POOLS,
) -> LoadPlan:
    """How many tokens past `num_computed` a decode engine of `num_layers` layers, each taking
    `pools` of rows `kv_width` wide (K/V: kv heads x head dim; MLA's latent: kv_lora_rank +
    qk_rope_head_dim), may load from `transfer_id` for `prompt`."""
    try:
        transfer = store.read(transfer_id)
    except TransferError as err:
        return LoadPlan(None if err.reason == "incomplete" else 0, str(err))
    except ValueError as err:  # an id that cannot name a transfer
        return LoadPlan(0, str(err))
    reason = mismatch(transfer, prompt, num_layers, kv_width, pools)
    if reason:
        return LoadPlan(0, f"KV transfer {transfer_id!r} does not fit this request: {reason}")
    return LoadPlan(max(0, len(prompt) - 1 - num_computed))


def plan_arena(
    params: dict,
    prompt: Sequence[int],
    *,
    num_computed: int,
    num_layers: int,
    kv_width: int,
    pools: Sequence[str] = KV_POOLS,
) -> LoadPlan:
    """How many tokens past `num_computed` load from the stages' arenas that `params` (an
    answer's kv_transfer_params, Mooncake transport) name; 0 with the reason when they cannot."""
    transfer_id = params.get("transfer_id")
    stages = params.get("stages")
    if not isinstance(stages, list) or not stages:
        return LoadPlan(0, f"KV transfer {transfer_id!r}: its params name no stage parts")
    if params.get("num_tokens") != len(prompt) or params.get("prompt_digest") != prompt_digest(
        prompt
    ):
        return LoadPlan(0, f"KV transfer {transfer_id!r} is of another prompt")
    for i, location in enumerate(stages):
        why = check_location(location)
        if why is None and location["num_tokens"] != len(prompt):
            why = f"it holds {location['num_tokens']} tokens; the prompt has {len(prompt)}"
        if why is not None:
            return LoadPlan(0, f"KV transfer {transfer_id!r}, stage {i}: {why}")
    why = layout_mismatch(
        [(i, location["pools"]) for i, location in enumerate(stages)], num_layers, kv_width, pools
    )
    if why is not None:
        return LoadPlan(0, f"KV transfer {transfer_id!r} does not fit this request: {why}")
    return LoadPlan(max(0, len(prompt) - 1 - num_computed))


def mismatch(
    transfer: Transfer,
    prompt: list[int],
    num_layers: int,
    kv_width: int,
    pools: Sequence[str] = KV_POOLS,
) -> str | None:
    """Why `transfer` cannot serve `prompt` on this engine, or None."""
    ids = transfer.token_ids
    if len(ids) < len(prompt) - 1 or ids[: len(prompt)] != prompt[: len(ids)]:
        return "its prompt is not this request's"
    return layout_mismatch(
        [(part.stage_id, part.manifest.get("pools", {})) for part in transfer.parts],
        num_layers,
        kv_width,
        pools,
    )


def layout_mismatch(
    parts: Sequence[tuple[int, dict]], num_layers: int, kv_width: int, pools: Sequence[str]
) -> str | None:
    """Why stage parts holding `parts` ([(stage, {pool: {"layers", "width", ...}})]) are not
    of this engine's model (other pools, rows of another width, not every layer), or None:
    one check for both transports."""
    layers = set()
    for stage_id, held in parts:
        if set(held) != set(pools):
            return (
                f"stage {stage_id} holds the pools {sorted(held)}; this model's layers take "
                f"{sorted(pools)}"
            )
        for name, pool in held.items():
            if pool["width"] != kv_width:
                return (
                    f"stage {stage_id}: its {name} rows are {pool['width']} wide; this model's "
                    f"are {kv_width} (another model?)"
                )
        layers.update(held[pools[0]]["layers"])
    if layers != set(range(num_layers)):
        return f"it covers {len(layers)} layers; this model has {num_layers} (another model?)"
    return None


class DecodePlanner:
    """A decode engine's per-request decisions over the store (the connector's scheduler side,
    free of vLLM):

        num_new_tokens(request_id, params, prompt, num_computed) -> tokens to load | None (ask again)
        forget(request_id)       the request was scheduled (loaded or not) or ended

    `params`: the request's kv_transfer_params. One with "error" (the prefill reports a stage's
    part failed) is refused without reading the store. A transfer still incomplete is asked
    about again until `wait_s` passed since the first time, then refused. A refusal is logged
    and counted (`num_misses`) once per request. Entries live from a request's first question
    to its `forget`: bounded by the requests the engine holds."""

    def __init__(
        self,
        store: DirectoryStore | None,
        *,
        block_size: int,
        num_layers: int,
        kv_width: int,
        pools: Sequence[str] = KV_POOLS,
        wait_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.store = store
        self.block_size, self.num_layers, self.kv_width = block_size, num_layers, kv_width
        self.pools = tuple(pools)
        self.wait_s = wait_s
        self.clock = clock
        self.num_misses = 0
        self._decided: dict[
            str, tuple[str, int]
        ] = {}  # request id -> (transfer id, tokens loadable from 0)
        self._waiting_since: dict[str, float] = {}  # request id -> first asked while incomplete

    def num_new_tokens(
        self, request_id: str, params: dict | None, prompt: Sequence[int], num_computed: int
    ) -> int | None:
        transfer_id = (params or {}).get("transfer_id")
        if not transfer_id:
            return 0
        decided = self._decided.get(request_id)
        if decided is None or decided[0] != transfer_id:
            end = self._decide(request_id, transfer_id, params, prompt)
            if end is None:
                return None
            decided = self._decided[request_id] = (transfer_id, end)
        return max(0, decided[1] - num_computed)

    def forget(self, request_id: str) -> None:
        self._decided.pop(request_id, None)
        self._waiting_since.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._decided) + len(self._waiting_since)

    def _decide(
        self, request_id: str, transfer_id: str, params: dict, prompt: Sequence[int]
    ) -> int | None:
        """How many of the prompt's tokens load from its start (0: it computes), or None."""
        if params.get("error"):
            reason = (
                f"the prefill reports that KV transfer {transfer_id!r} failed: {params['error']}"
            )
            end = 0
        elif "stages" in params:  # the Mooncake transport: the stages' arenas
            plan = plan_arena(
                params,
                prompt,
                num_computed=0,
                num_layers=self.num_layers,
                kv_width=self.kv_width,
                pools=self.pools,
            )
            reason, end = plan.reason, plan.num_tokens
        else:  # the directory transport: the store
            plan = self._plan_from_store(request_id, transfer_id, prompt)
            if plan is None:
                return None
            reason, end = plan.reason, plan.num_tokens or 0
        self._waiting_since.pop(request_id, None)
        if not end and reason:
            self.num_misses += 1
            log.warning("request %s computes its prompt: %s", request_id, reason)
        return end

    def _plan_from_store(
        self, request_id: str, transfer_id: str, prompt: Sequence[int]
    ) -> LoadPlan | None:
        """The store's plan for the request; None while its stages are still writing and the
        request has waited less than `wait_s` (the first time it asked starts the wait)."""
        if self.store is None:
            return LoadPlan(
                0,
                f"KV transfer {transfer_id!r} is in a directory store and this connector has "
                'none (kv_connector_extra_config {"store": DIR})',
            )
        plan = plan_load(
            self.store,
            transfer_id,
            list(prompt),
            block_size=self.block_size,
            num_computed=0,
            num_layers=self.num_layers,
            kv_width=self.kv_width,
            pools=self.pools,
        )
        if plan.num_tokens is None:  # the stages are still writing: ask again, up to wait_s
            first = self._waiting_since.setdefault(request_id, self.clock())
            if self.clock() - first < self.wait_s:
                return None
        return plan
