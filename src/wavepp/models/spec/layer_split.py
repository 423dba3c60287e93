"""The layer split balanced by cost: which contiguous layers each stage holds so that the
slowest stage is as fast as it can be.

A pipeline runs at the pace of its slowest stage. Given each layer's cost (seconds measured at
start-up, or the cost model's FLOPs: `LayerCosts`) and what a stage carries besides its layers
(the embedding on the first, the final norm and LM head on the last), `balanced_split` finds
the contiguous split that minimizes the largest stage cost:

    layers   [0, n0)  stage 0 (+ embedding)  |  [n0, n0 + n1)  stage 1  |  ...  |  last (+ head)
    cost(s) = fixed_costs[s] + sum of its layers' costs          minimize max over s of cost(s)

Pure Python, shared by the runtime (engine.py, `layer_split="auto"`) and the simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

SPLIT_SETTINGS = ("auto", "even")  # layer_split's words; a tuple of counts is the other form


def balanced_split(
    layer_costs: Sequence[float], num_stages: int, fixed_costs: Sequence[float] = ()
) -> tuple[int, ...]:
    """Each stage's number of layers, in order: contiguous, every stage at least one layer,
    the largest stage cost (`fixed_costs[s]` plus its layers' `layer_costs`) as small as any
    split makes it (within a relative 1e-9: float sums of equal costs differ in their last
    bits). Ties, in turn: the smallest sum of squared stage costs (the slack spread
    evenly, within a relative 1e-9), then the earlier stages the most layers (the
    lexicographically largest counts). So equal layer costs give the count split back
    (`split_layers`: sizes differing by at most one, the larger first).

    `fixed_costs`: one per stage (default: none). ValueError for num_stages outside
    [1, len(layer_costs)], a cost that is negative or not finite, or fixed_costs of another
    length. O(num_stages * num_layers^2) steps: a few ms for 61 layers on 8 stages."""
    costs, fixed = _checked(layer_costs, num_stages, fixed_costs)
    table = _SplitTable(costs, fixed)
    # each stage in turn takes the most layers that keep the optimum (the same float
    # expressions the tables were built from, so the optimum's own cut always qualifies)
    sizes, i = [], 0
    for s in range(num_stages):
        j = next(j for j in table.ends(s, i, descending=True) if table.keeps_optimum(s, i, j))
        sizes.append(j - i)
        i = j
    return tuple(sizes)


class _SplitTable:
    """balanced_split's dynamic programs over (stage s, first layer i) of the stages s, s+1, ...
    holding layers [i, n):

        tail[s][i]     the smallest slowest-stage cost (inf: fewer layers than stages left)
        squares[s][i]  the smallest sum of squared stage costs among those splits whose every
                       stage stays within the optimum, tail[0][0] (`within`)
    """

    def __init__(self, costs: list[float], fixed: list[float]):
        self.n, self.num_stages, self.fixed = len(costs), len(fixed), fixed
        self.prefix = [0.0]
        for c in costs:
            self.prefix.append(self.prefix[-1] + c)
        n, stages, inf = self.n, self.num_stages, math.inf
        self.tail = [[inf] * (n + 1) for _ in range(stages + 1)]
        self.squares = [[inf] * (n + 1) for _ in range(stages + 1)]
        self.tail[stages][n] = self.squares[stages][n] = 0.0
        for s in range(stages - 1, -1, -1):
            for i in range(s, n - (stages - s - 1)):
                self.tail[s][i] = min(
                    max(self.cost(s, i, j), self.tail[s + 1][j]) for j in self.ends(s, i)
                )
        self.optimum = self.tail[0][0]
        for s in range(stages - 1, -1, -1):
            for i in range(s, n - (stages - s - 1)):
                self.squares[s][i] = min(
                    (
                        self.cost(s, i, j) ** 2 + self.squares[s + 1][j]
                        for j in self.ends(s, i)
                        if self.within(s, i, j)
                    ),
                    default=inf,
                )

    def cost(self, s: int, i: int, j: int) -> float:
        """Stage s holding layers [i, j)."""
        return self.fixed[s] + (self.prefix[j] - self.prefix[i])

    def ends(self, s: int, i: int, descending: bool = False) -> range:
        """Where stage s may end when it starts at layer i: one layer at least, one left for
        each later stage."""
        last = self.n - (self.num_stages - s - 1)
        return range(last, i, -1) if descending else range(i + 1, last + 1)

    def within(self, s: int, i: int, j: int) -> bool:
        """Stage s on [i, j) and the best split of the rest all within the optimum (a relative
        1e-9 over it: sums of the same costs in another order differ in their last bits)."""
        return max(self.cost(s, i, j), self.tail[s + 1][j]) <= self.optimum * (1 + 1e-9)

    def keeps_optimum(self, s: int, i: int, j: int) -> bool:
        """Stage s on [i, j) leaves a split as good as the best from (s, i) on both counts."""
        best = self.squares[s][i]
        return self.within(s, i, j) and (
            self.cost(s, i, j) ** 2 + self.squares[s + 1][j] <= best + 1e-9 * abs(best)
        )


def stage_costs(
    layer_costs: Sequence[float], sizes: Sequence[int], fixed_costs: Sequence[float] = ()
) -> tuple[float, ...]:
    """Each stage's cost under the split `sizes` (layer counts in order, summing to the layers):
    `fixed_costs[s]` plus its layers' costs."""
    if sum(sizes) != len(layer_costs) or min(sizes, default=0) < 1:
        raise ValueError(
            f"layer split {list(sizes)} must give each stage at least one layer and sum to "
            f"the {len(layer_costs)} layers"
        )
    fixed = list(fixed_costs) or [0.0] * len(sizes)
    if len(fixed) != len(sizes):
        raise ValueError(f"fixed_costs has {len(fixed)} entries for {len(sizes)} stages")
    out, start = [], 0
    for n, extra in zip(sizes, fixed):
        out.append(extra + sum(layer_costs[start : start + n]))
        start += n
    return tuple(out)


@dataclass(frozen=True)
class LayerCosts:
    """What each part of a model costs on a reference workload: `layers[i]` layer i, `first`
    what only the first stage runs (the token embedding), `last` what only the last stage runs
    (the final norm and the LM head). `unit`: "s" or "flop"; only ratios matter to a split.
    `source`: where they come from, "measured" (runtime/layer_timing.py), "cost model"
    (spec/layer_cost.py) or "simulator" (sim/cost/stages.py)."""

    layers: tuple[float, ...]
    first: float = 0.0
    last: float = 0.0
    unit: str = "s"
    source: str = "measured"

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(float(c) for c in self.layers))
        values = (*self.layers, self.first, self.last)
        if not self.layers or not all(math.isfinite(c) and c >= 0 for c in values):
            raise ValueError(
                f"LayerCosts needs at least one layer and finite costs >= 0, got {values}"
            )
        if self.unit not in ("s", "flop"):
            raise ValueError(f"LayerCosts.unit must be 's' or 'flop', got {self.unit!r}")

    def fixed_costs(self, num_stages: int) -> tuple[float, ...]:
        """Each stage's cost besides its layers: the embedding on the first, the head on the last
        (both on a stage that is both)."""
        fixed = [0.0] * num_stages
        fixed[0] += self.first
        fixed[-1] += self.last
        return tuple(fixed)

    def balanced(self, num_stages: int) -> tuple[int, ...]:
        """`balanced_split` of these costs over `num_stages` stages."""
        return balanced_split(self.layers, num_stages, self.fixed_costs(num_stages))

    def shares(self, sizes: Sequence[int]) -> tuple[float, ...]:
        """Each stage's predicted share of the pipeline's work under `sizes` (summing to 1)."""
        costs = stage_costs(self.layers, sizes, self.fixed_costs(len(sizes)))
        total = sum(costs)
        return tuple(c / total if total else 1 / len(costs) for c in costs)


@dataclass(frozen=True)
class StageSplit:
    """The split a pipeline runs: `sizes` (layers per stage), how it was chosen (`method`:
    "auto", "even" (the count split), or "given"), and each stage's predicted share of the work
    under `costs` (their `source` says whether measured or from the cost model)."""

    sizes: tuple[int, ...]
    method: str
    costs: LayerCosts

    @property
    def shares(self) -> tuple[float, ...]:
        return self.costs.shares(self.sizes)

    @property
    def imbalance(self) -> float:
        """The slowest stage's predicted time over the mean stage's (1.0: perfectly even)."""
        shares = self.shares
        return max(shares) * len(shares)

    def describe(self) -> str:
        """One line, e.g. "layers per stage 4,3 (auto, measured costs): predicted shares
        50.1% 49.9%, slowest 1.00x the mean"."""
        shares = " ".join(f"{100 * s:.1f}%" for s in self.shares)
        return (
            f"layers per stage {','.join(map(str, self.sizes))} ({self.method}, "
            f"{self.costs.source} costs): predicted shares {shares}, slowest "
            f"{self.imbalance:.2f}x the mean"
        )


def _checked(
    layer_costs: Sequence[float], num_stages: int, fixed_costs: Sequence[float]
) -> tuple[list[float], list[float]]:
    costs = [float(c) for c in layer_costs]
    if isinstance(num_stages, bool) or not isinstance(num_stages, int):
        raise ValueError(f"num_stages must be an int, got {num_stages!r}")
    if not 1 <= num_stages <= len(costs):
        raise ValueError(
            f"cannot split {len(costs)} layers into {num_stages} stages "
            f"(need 1 <= num_stages <= {len(costs)}: every stage holds a layer)"
        )
    fixed = [float(c) for c in fixed_costs] or [0.0] * num_stages
    if len(fixed) != num_stages:
        raise ValueError(f"fixed_costs has {len(fixed)} entries for {num_stages} stages")
    if not all(math.isfinite(c) and c >= 0 for c in costs + fixed):
        raise ValueError(f"costs must be finite and >= 0, got {costs} and fixed {fixed}")
    return costs, fixed
