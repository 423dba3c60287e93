"""Expert imbalance: how much more than its share the busiest device of an EP group computes.

Routing is not uniform: some experts are hot, and a device holds a fixed set of them, so at
each MoE layer the devices get unequal token counts and every device waits for the busiest
at the exchange. Balancedness (mean / max tokens per device, per MoE layer) falls with the EP
size, and a placement from measured expert loads with redundant experts (EPLB) raises it.
SGLang measured it on DeepSeek-V3 with real routing statistics (LMSYS blog 2025-05-05,
"Large-scale Expert Parallelism", figure "Effects of Scale and EPLB to Balancedness", read off
the plot):

    GPUs           8      16     32     64-72
    without EPLB   0.67   0.61   0.55   0.48 (62 GPUs)
    with EPLB      0.94   0.90   0.80   0.81 (72 GPUs)

`balancedness(devices, placement)` interpolates that curve in log(devices) and holds its ends;
"perfect" is 1 (SGLang's "simulated perfect EPLB", DeepSeek's balanced profile). A device count
of 1 is 1. The busiest device's routed-expert GEMMs and its share of the exchange take
1 / balancedness of the mean's time (sim/cost/stage_cost.py, sim/cost/dp_attention.py).

The curve is DeepSeek-V3's routing on SGLang's data; other MoE models (256 or 384 experts, top-8)
are assumed to route as unevenly.
"""

from __future__ import annotations

import math

PLACEMENTS = ("default", "eplb", "perfect")

# (GPUs, balancedness) read off the figure (module docstring)
_WITHOUT_EPLB = ((8, 0.67), (16, 0.61), (32, 0.55), (62, 0.48))
_WITH_EPLB = ((8, 0.94), (16, 0.90), (32, 0.80), (72, 0.81))


def balancedness(devices: int, placement: str) -> float:
    """Mean over max tokens per device of an EP group of `devices` (module docstring)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown expert placement {placement!r}; choose one of {PLACEMENTS}")
    if devices <= 1 or placement == "perfect":
        return 1.0
    curve = _WITHOUT_EPLB if placement == "default" else _WITH_EPLB
    x = math.log(devices)
    if x <= math.log(curve[0][0]):
        # below 8 GPUs: toward 1 at one device, linearly in log(devices)
        n0, b0 = curve[0]
        return 1.0 - (1.0 - b0) * x / math.log(n0)
    for (n0, b0), (n1, b1) in zip(curve, curve[1:]):
        if x <= math.log(n1):
            t = (x - math.log(n0)) / (math.log(n1) - math.log(n0))
            return b0 + t * (b1 - b0)
    return curve[-1][1]


def imbalance(devices: int, placement: str) -> float:
    """Time of the busiest device's expert work over the mean's: 1 / balancedness."""
    return 1.0 / balancedness(devices, placement)
