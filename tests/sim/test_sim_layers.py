"""The simulator's subpackages import only the ones below them (docs/design.md, "sim"): cost and
core import no other part of the simulator, loops only core, harness.py core and loops, studies
any of them; and nothing of the simulator imports `wavepp.sim` itself, whose __init__ imports
them all."""

from __future__ import annotations

from tests.test_layout import import_graph

MAY_IMPORT = {
    "cost": set(),
    "core": set(),
    "loops": {"core"},
    "harness": {"core", "loops"},
    "studies": {"cost", "core", "loops", "harness"},
}


def _part(module: str) -> str:
    """wavepp.sim.cost.hardware -> cost; wavepp.sim.harness -> harness; wavepp.sim -> ''."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else ""


def test_each_part_imports_only_the_parts_below_it():
    graph = import_graph()
    parts = {_part(m) for m in graph if m.startswith("wavepp.sim.")}
    assert parts == set(MAY_IMPORT)
    wrong = {
        (module, dep)
        for module, deps in graph.items()
        if module.startswith("wavepp.sim.")
        for dep in deps
        if dep.startswith("wavepp.sim") and _part(dep) != _part(module)
        if _part(dep) not in MAY_IMPORT[_part(module)]
    }
    assert wrong == set()
