"""A stage's memory in a simulated setting: how many blocks its pool holds (what its HBM leaves
for KV, a hybrid model's snapshot slots taking their share), the snapshot grid, the host KV
tier beside it and its view of the KV store replicas share. Used by scenario.py's
build_system."""

from __future__ import annotations

from wavepp.cache import HostTier, default_interval_blocks
from wavepp.cache.store_tier import StoreTier
from wavepp.sim.core.shared_store import SimSharedStore
from wavepp.sim.cost.model_shapes import ModelShape
from wavepp.sim.cost.stage_cost import kv_split
from wavepp.sim.cost.stages import stage_kv_tokens
from wavepp.sim.harness import hybrid_pool_blocks
from wavepp.sim.studies.sim_setup import SimSetup
from wavepp.sim.studies.systems import SystemSpec


def pool_blocks(
    spec: SystemSpec,
    setup: SimSetup,
    bounds: list[tuple[int, int]],
    degree: int,
    interval: int | None,
) -> list[int]:
    """Simulated blocks of each stage's pool: the KV tokens its memory holds (SGLang's loop: as
    its MIN over the ranks sizes them), less a hybrid model's snapshot slots' share, capped at
    `setup.max_pool_blocks`."""
    m, hw = setup.model, setup.hardware
    last = len(bounds) - 1
    kv_tokens = [
        stage_kv_tokens(
            m,
            hw,
            a,
            b,
            first=i == 0,
            last=i == last,
            degree=degree,
            budget=setup.memory,
            layout=spec.layout,
        )
        for i, (a, b) in enumerate(bounds)
    ]
    if spec.loop == "sglang" and setup.sglang.min_free_memory:
        kv_tokens = _min_free_memory_tokens(m, bounds, kv_tokens)
    blocks = [max(1, t // (setup.block_size * setup.token_scale)) for t in kv_tokens]
    if m.hybrid:  # the snapshot slots share the stage's cache memory with the blocks
        blocks = [
            hybrid_pool_blocks(
                n, *_block_and_snapshot_bytes(m, setup, a, b, degree, spec.layout), interval
            )
            for n, (a, b) in zip(blocks, bounds)
        ]
    return [min(n, setup.max_pool_blocks) for n in blocks]


def host_tiers(
    spec: SystemSpec, setup: SimSetup, bounds: list[tuple[int, int]], degree: int
) -> list[HostTier] | None:
    """One host KV tier per stage where the setup has one and the system takes it (a central
    pool never does), else None."""
    if setup.host_kv_gib and _takes_tiers(spec, setup):
        return [host_tier(setup.model, setup, a, b, degree, spec.layout) for a, b in bounds]
    return None


def store_tiers(
    spec: SystemSpec,
    setup: SimSetup,
    bounds: list[tuple[int, int]],
    degree: int,
    shared: SimSharedStore | None,
) -> list[StoreTier] | None:
    """Each stage's view of the `shared` store where there is one and the system takes the
    tiers (as `host_tiers`), else None. A stage's namespace names what its entries hold: the
    model, the KV element, how the devices split the layers, the real tokens of a block and
    the stage's layers, so the stage of the same layers on every replica shares its entries
    and a stage of other layers finds none. An entry costs the stage's bytes of a block, as in
    its host tier."""
    if shared is None or not _takes_tiers(spec, setup):
        return None
    m, block_tokens = setup.model, setup.block_size * setup.token_scale
    tiers = []
    for a, b in bounds:
        block_bytes = max(1, int(_block_and_snapshot_bytes(m, setup, a, b, degree, spec.layout)[0]))
        namespace = f"{m.name}/kv{m.kv_bytes:g}/{spec.layout}{degree}/b{block_tokens}/l{a}-{b}"
        tiers.append(StoreTier(namespace, block_bytes, shared.link(block_bytes)))
    return tiers


def host_tier(
    model: ModelShape, setup: SimSetup, start: int, end: int, degree: int = 1, layout: str = "tp"
) -> HostTier:
    """The host KV tier of one rank holding layers [start, end): `setup.host_kv_gib` of host
    memory; a simulated block costs the KV bytes of `block_size * token_scale` real tokens of
    those layers (one device's share), a snapshot the states of its linear layers."""
    block_bytes, snapshot_bytes = _block_and_snapshot_bytes(
        model, setup, start, end, degree, layout
    )
    return HostTier(int(setup.host_kv_gib * 2**30), max(1, int(block_bytes)), int(snapshot_bytes))


def model_interval_blocks(setup: SimSetup) -> int:
    """A hybrid model's snapshot grid in simulated blocks: `setup.snapshot_interval_blocks`, or
    as the runtime picks it (`default_interval_blocks`: a snapshot of every layer against the
    cache bytes of a block of every layer, here a block of `block_size * token_scale` real
    tokens)."""
    if setup.snapshot_interval_blocks:
        return setup.snapshot_interval_blocks
    m = setup.model
    snapshot_bytes = m.layers_snapshot_bytes(0, m.num_layers)
    block_bytes = (
        m.layers_kv_bytes_per_token(0, m.num_layers) * setup.block_size * setup.token_scale
    )
    return default_interval_blocks(int(snapshot_bytes), int(block_bytes))


def _takes_tiers(spec: SystemSpec, setup: SimSetup) -> bool:
    """Whether `spec` runs the tiers below its pools (a host tier, the shared store): wavepp's
    own caches, or every system with `setup.host_tier_for_baselines`; a central pool never."""
    return (spec.host_tier or setup.host_tier_for_baselines) and spec.topology != "central"


def _min_free_memory_tokens(
    model: ModelShape, bounds: list[tuple[int, int]], kv_tokens: list[int]
) -> list[int]:
    """SGLang's PP pool sizing: the free memory left after the weights, all-reduced with MIN over
    the ranks, holds each rank's own layers' KV (a stage of linear-attention layers only keeps
    what it had: no per-token KV)."""
    per_token = [model.layers_kv_bytes_per_token(a, b) for a, b in bounds]
    free = [t * p for t, p in zip(kv_tokens, per_token) if p > 0]
    if not free:
        return kv_tokens
    return [int(min(free) / p) if p > 0 else t for t, p in zip(kv_tokens, per_token)]


def _block_and_snapshot_bytes(
    model: ModelShape, setup: SimSetup, start: int, end: int, degree: int, layout: str = "tp"
) -> tuple[float, float]:
    """One device's bytes of a simulated block (the KV of `block_size * token_scale` real
    tokens of layers [start, end)) and of a snapshot (their linear layers' states; 0 for a
    model without)."""
    per_token = model.layers_kv_bytes_per_token(start, end) / kv_split(model, degree, layout)
    snapshot_bytes = model.layers_snapshot_bytes(start, end) / degree if model.hybrid else 0.0
    return per_token * setup.block_size * setup.token_scale, snapshot_bytes
