"""What a decode engine may load of a transfer: the decision its connector makes, engine-free.

    plan_load(store, transfer_id, prompt, ...) -> LoadPlan(num_tokens, reason)

    num_tokens > 0   load prompt tokens [num_computed, num_computed + num_tokens)
    num_tokens == 0  load nothing: compute the prompt (`reason` says why, for the log and the
                     miss counter: missing, failed, corrupt, another prompt or model), or
                     nothing is left past what the engine has cached itself
    num_tokens None  the stages are still writing: ask again (until the caller's wait runs out)

A decode engine computes at least the prompt's last token (it needs its logits) and takes whole
blocks of its own, so at most `(len(prompt) - 1) // block_size * block_size` tokens load.
"""

from __future__ import annotations

from dataclasses import dataclass

from wavepp.kv_transfer.store import DirectoryStore, Transfer, TransferError


@dataclass(frozen=True)
class LoadPlan:
    num_tokens: int | None
    reason: str = ""


def plan_load(store: DirectoryStore, transfer_id, prompt: list[int], *, block_size: int, num_computed: int,
              num_layers: int, kv_width: int) -> LoadPlan:
    """How many tokens past `num_computed` a decode engine of `num_layers` attention layers with
    K/V rows `kv_width` wide (kv heads x head dim) may load from `transfer_id` for `prompt`."""
    try:
        transfer = store.read(transfer_id)
    except TransferError as err:
        return LoadPlan(None if err.reason == "incomplete" else 0, str(err))
    except ValueError as err:          # an id that cannot name a transfer
        return LoadPlan(0, str(err))
    reason = mismatch(transfer, prompt, num_layers, kv_width)
    if reason:
        return LoadPlan(0, f"KV transfer {transfer_id!r} does not fit this request: {reason}")
    end = (len(prompt) - 1) // block_size * block_size
    return LoadPlan(max(0, end - num_computed))


def mismatch(transfer: Transfer, prompt: list[int], num_layers: int, kv_width: int) -> str | None:
    """Why `transfer` cannot serve `prompt` on this engine, or None."""
    ids = transfer.token_ids
    if len(ids) < len(prompt) - 1 or ids[:len(prompt)] != prompt[:len(ids)]:
        return "its prompt is not this request's"
    layers = set()
    for part in transfer.parts:
        pools = part.manifest.get("pools", {})
        if set(pools) != {"key", "value"}:
            return f"stage {part.stage_id} holds the pools {sorted(pools)}, not an attention layer's key and value"
        for pool in pools.values():
            if pool["width"] != kv_width:
                return f"its K/V rows are {pool['width']} wide; this model's are {kv_width} (another model?)"
        layers.update(pools["key"]["layers"])
    if layers != set(range(num_layers)):
        return f"it covers {len(layers)} layers; this model has {num_layers} (another model?)"
    return None
