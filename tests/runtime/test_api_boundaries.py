"""The engine, the server and the outside loop reach the core only through its public surface.

An AST scan, no engine started: `x._name` (or `getattr(x, "_name")`) where x is not `self` or
`cls` is another object's private attribute; the Engine and the server never reach through the
core into its leader, stage or lock; the outside loop uses only what LoopHost declares."""

from __future__ import annotations

import ast
from pathlib import Path

import wavepp
from wavepp.runtime.loop_host import LoopHost

SRC = Path(wavepp.__file__).parent
ENGINE_AND_SERVER = [SRC / "engine.py", *sorted((SRC / "serve").glob("*.py"))]
OUTSIDE_LOOP = SRC / "runtime" / "outside_loop.py"
# the core's parts that only the core itself (and its tests) may touch
CORE_INSIDES = {"leader", "stage", "cond", "channels", "server", "pool"}


def _private_accesses(path: Path) -> list[str]:
    """`line: expr` of every access to another object's private attribute in `path`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        name, owner = None, None
        if isinstance(node, ast.Attribute):
            name, owner = node.attr, node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            name, owner = node.args[1].value, node.args[0]
        if (
            name is None
            or not name.startswith("_")
            or (name.startswith("__") and name.endswith("__"))
        ):
            continue
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        out.append((node.lineno, f"{path.name}:{node.lineno}: {ast.unparse(node)}"))
    return [hit for _, hit in sorted(out)]


def _attributes_of(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """(line, attribute) of every `n.attr` in `path` where n is `self.core`/`self._core`/
    `self.host` or a local name in `names`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in names:
            out.append((node.lineno, node.attr))
        elif (
            isinstance(owner, ast.Attribute)
            and isinstance(owner.value, ast.Name)
            and owner.value.id == "self"
            and owner.attr in names
        ):
            out.append((node.lineno, node.attr))
    return sorted(out)


def test_no_private_attribute_of_another_object():
    found = [hit for path in [*ENGINE_AND_SERVER, OUTSIDE_LOOP] for hit in _private_accesses(path)]
    assert found == []


def test_the_engine_and_the_server_use_the_core_s_public_methods():
    reached = [
        f"{path.name}:{line}: .{attr}"
        for path in ENGINE_AND_SERVER
        for line, attr in _attributes_of(path, {"core", "_core", "engine"})
        if attr in CORE_INSIDES
    ]
    assert reached == []


def test_the_outside_loop_uses_only_what_loop_host_declares():
    declared = set(LoopHost.__annotations__) | {n for n in vars(LoopHost) if not n.startswith("_")}
    assert {"cond", "num_stages", "run_round", "plan_wave", "launch", "on_wave_result"} <= declared
    used = _attributes_of(OUTSIDE_LOOP, {"host", "core"})
    assert used, "the scan found no use of the host: did the loop rename it?"
    assert [(line, attr) for line, attr in used if attr not in declared] == []


def test_the_scan_sees_what_it_looks_for(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f(self, core):\n    core._live.get(1)\n    getattr(core, '_stats')\n"
        "    self._core.leader.requests\n    self._ok\n    type(core).__name__\n"
    )
    assert _private_accesses(sample) == [
        "sample.py:2: core._live",
        "sample.py:3: getattr(core, '_stats')",
    ]
    assert (4, "leader") in _attributes_of(sample, {"_core"})
