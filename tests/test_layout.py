"""The code's shape, as docs/design.md states it: short functions, no import cycles, the
pure-Python layers free of torch, every WAVEPP_ switch read in env.py, and a layer map that names
real modules. Static reads of the source, plus fresh interpreters for the import checks."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import wavepp

SRC = Path(wavepp.__file__).parent
ROOT = SRC.parent.parent
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, tuple[Path, bool]]:
    """dotted name -> (path, is_package) for every module under src/wavepp."""
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_pkg)
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node, lazy ones inside functions included, except those under
    `if TYPE_CHECKING:` (they never run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    """module -> the wavepp modules it imports (a name imported from a package resolves to the
    submodule when there is one)."""
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for mod, (path, is_pkg) in mods.items():
        package = mod if is_pkg else mod.rpartition(".")[0]
        deps = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(r for a in node.names if (r := resolve(a.name)))
                continue
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            deps.update(r for a in node.names if (r := resolve(f"{module}.{a.name}")))
        deps.discard(mod)
        graph[mod] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules():
    assert cycles(import_graph()) == []


def test_no_function_over_the_limit():
    """No function or method in src is over 80 lines, from its `def` to its last line; one that
    is, is split by the steps it takes. Files are not bounded: a file holds one noun and
    grows until a second noun with its own state comes out of it. A line limit on files gets
    them split by method instead, into mixins that work on state their owner creates."""
    long = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                num_lines = node.end_lineno - node.lineno + 1
                if num_lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(SRC)}:{node.lineno} {node.name}"] = num_lines
    assert long == {}


def test_no_class_name_is_defined_twice():
    """One name per concept: a module-level class name names one class in src/."""
    where: dict[str, list[str]] = {}
    for p in SRC.rglob("*.py"):
        for match in re.finditer(r"^class (\w+)", p.read_text(), re.MULTILINE):
            where.setdefault(match.group(1), []).append(str(p.relative_to(SRC)))
    assert {name: files for name, files in where.items() if len(files) > 1} == {}


@pytest.mark.parametrize(
    "package",
    [
        "wavepp.models",
        "wavepp.cache",
        "wavepp.sched",
        "wavepp.sim",
        "wavepp.workloads",
        "wavepp.env",
        "wavepp.route",  # the router, a program of its own
        "wavepp.route.replica_table",
        "wavepp.openai_http",  # what the router shares with the server
        "wavepp.kv_transfer",  # the registry of transports, the usage record
        "wavepp.kv_transfer.handoff",  # rank 0's hand-off, its reports, the directory store
        "wavepp.kv_transfer.mooncake.ledger",
    ],
)
def test_pure_python_layers_import_no_torch(package):
    code = f"import sys, {package}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_route_command_imports_no_torch():
    """`wavepp route` loads no torch: not its command module, not what its `run` imports (the
    router and its config), not what `wavepp route --help` runs through (every command's
    parser)."""
    code = (
        "import sys\n"
        "import wavepp.cli.route, wavepp.route.config, wavepp.route.router\n"
        "from wavepp.cli import main\n"
        "try:\n"
        "    main(['route', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "--routing" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_the_simulator_reads_the_model_spec_not_hf_configs():
    """sim/ gets model shapes from the registry's parser and the torch-free spec: it imports
    neither transformers nor json-config readers of its own."""
    graph = import_graph()
    sim_deps = set().union(*(deps for mod, deps in graph.items() if mod.startswith("wavepp.sim")))
    assert "wavepp.models.registry" in sim_deps
    # the model shapes and the named models (whose comments cite each released config.json)
    readers = {"cost/model_shapes.py", "cost/model_catalog.py"}
    files = {str(p.relative_to(SRC / "sim")): p for p in (SRC / "sim").rglob("*.py")}
    assert readers <= set(files), sorted(files)
    for name, path in files.items():
        text = path.read_text()
        assert "import transformers" not in text and "from transformers" not in text, name
        assert "config.json" not in text or name in readers, name


def test_every_environment_switch_is_read_in_env_py():
    pattern = re.compile(r"WAVEPP_[A-Z_]+|os\.environ|getenv")
    readers = {}
    for path in SRC.rglob("*.py"):
        if path.name == "env.py" and path.parent == SRC:
            continue
        text = path.read_text()
        hits = {m for m in pattern.findall(text) if m in ("os.environ", "getenv")}
        if hits:
            readers[str(path.relative_to(SRC))] = sorted(hits)
    # torchrun's own variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) are its contract
    # with the process it starts, read where the process finds its place, not wavepp switches
    allowed = {"runtime/launch.py", "runtime/device.py"}
    assert {k: v for k, v in readers.items() if k not in allowed} == {}
    documented = set(re.findall(r"WAVEPP_[A-Z_]+", (SRC / "env.py").read_text()))
    used = set()
    for path in SRC.rglob("*.py"):
        used.update(re.findall(r"WAVEPP_[A-Z_]+", path.read_text()))
    assert used <= documented
    kernels_doc = (ROOT / "docs" / "kernels.md").read_text()
    assert {name for name in documented if name not in kernels_doc} == set()


def test_design_layer_map_names_modules_that_exist():
    """Every `wavepp/...` path the design document names exists, and so does every file name
    (`x.py`) of its layer map."""
    text = (ROOT / "docs" / "design.md").read_text()
    named = set(re.findall(r"`((?:src/)?wavepp/[\w/]+(?:\.py)?)`", text))
    assert len(named) >= 8, "docs/design.md names too few modules"
    missing = sorted(p for p in named if not (ROOT / "src" / p.removeprefix("src/")).exists())
    assert missing == []
    files = {p.name for p in [*SRC.rglob("*.py"), *(ROOT / "tests").rglob("*.py")]}
    assert sorted(set(re.findall(r"\b(\w+\.py)\b", text)) - files) == []


def _doc_paths(text: str) -> set[str]:
    """Backquoted relative paths of source, test or benchmark files and folders in a document."""
    return {
        m
        for m in re.findall(r"`([\w./-]+/[\w.-]*)`", text)
        if not m.startswith(("http", "/", "../", "~"))
        and (m.endswith("/") or "." in m.rsplit("/", 1)[-1])
    }


def _exists(path: str) -> bool:
    path = path.rstrip("/")
    return any(
        (base / path).exists()
        for base in (
            ROOT,
            ROOT / "src",
            SRC,
            SRC / "models",
            SRC / "models" / "kernels",
            ROOT / "docs",
        )
    )


@pytest.mark.parametrize(
    "doc",
    [
        "README.md",
        "docs/design.md",
        "docs/models.md",
        "docs/kernels.md",
        "docs/simulator.md",
        "docs/serving.md",
        "docs/hybrid.md",
        "docs/disaggregation.md",
        "docs/engine.md",
    ],
)
def test_documents_name_files_that_exist(doc):
    """The living documents (not the dated records under docs/benchmarks/) name only paths that
    exist: a module that moved makes this fail until the document follows."""
    missing = sorted(p for p in _doc_paths((ROOT / doc).read_text()) if not _exists(p))
    assert missing == []
