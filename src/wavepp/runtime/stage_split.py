"""The layer split a pipeline runs: chosen once, on rank 0, before any stage process starts
(engine.py), and handed to every stage in its RuntimeConfig.

    layer_split     the layers per stage                     predicted shares from
    (14, 16)        as given ("given")                       the cost model
    "even"          the count split (spec/model.py)          the cost model
    "auto"          balanced_split of the layers' costs       those costs
    () the default  "auto" where the model's layers differ (dense and MoE MLPs, linear and
                    full attention, DSA indexers), else "even": a uniform model keeps the count
                    split as it always had it

`auto`'s costs are measured (runtime/layer_timing.py: each kind of layer timed on the device
the stages use, about a second on the tiny models) where the start-up profile is on
(`profile_waves`), and come from the cost model of the layers' kinds (spec/layer_cost.py: FLOPs)
where it is off, or where a shared KV tier is set: replicas find each other's blocks there only
under the same layer ranges, and measured times differ from one start to the next where FLOPs
do not. A pipeline of one stage, or of one layer a stage, has one split: nothing is measured.
"""

from __future__ import annotations

import logging

from wavepp.engine_config import EngineConfig
from wavepp.models.spec import LayerCosts, ModelSpec, StageSplit, split_layers
from wavepp.models.spec.layer_cost import modeled_costs
from wavepp.runtime.device import TORCH_DTYPES
from wavepp.runtime.layer_timing import measure_layer_costs

log = logging.getLogger(__name__)


def choose_stage_split(
    config: EngineConfig, spec: ModelSpec, model_path: str, device: str
) -> StageSplit:
    """The split `config.layer_split` asks for, on `spec`'s layers (see the module's table).
    ValueError for a split that does not fit the model (more stages than layers, counts that do
    not sum to its layers), before anything is measured."""
    pp, n = config.pp, spec.num_layers
    setting = config.layer_split or ("auto" if layers_differ(spec) else "even")
    if isinstance(setting, tuple):
        sizes = _sizes(split_layers(n, pp, setting))
        return StageSplit(sizes, "given", modeled_costs(spec))
    count_split = _sizes(split_layers(n, pp))  # raises for more stages than layers
    if setting == "even":
        return StageSplit(count_split, "even", modeled_costs(spec))
    costs = auto_costs(config, spec, model_path, device)
    return StageSplit(costs.balanced(pp), "auto", costs)


def auto_costs(config: EngineConfig, spec: ModelSpec, model_path: str, device: str) -> LayerCosts:
    """The costs `auto` balances: measured, or the cost model's (the module's docstring)."""
    if not config.profile_waves or config.kv_tier is not None or config.pp in (1, spec.num_layers):
        return modeled_costs(spec)
    costs = measure_layer_costs(
        model_path,
        spec,
        TORCH_DTYPES[config.dtype],
        device,
        config.block_size,
        num_threads=config.num_threads,
    )
    log.info("layer costs measured (ms): %s", ", ".join(f"{c * 1e3:.2f}" for c in costs.layers))
    return costs


def layers_differ(spec: ModelSpec) -> bool:
    """Whether the model's layers are of more than one kind (attention or MLP)."""
    return len(set(spec.layers)) > 1


def _sizes(bounds: list[tuple[int, int]]) -> tuple[int, ...]:
    return tuple(end - start for start, end in bounds)
