"""The rooms' rules (docs/architecture.md): imports go down only (runtime, passes, plan,
targets, exporter), no module imports itself back, and the runtime, the device's bottom
floor, loads alone."""

import functools
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import ROOT  # noqa: E402


def test_runtime_imports_no_upper_room(ran):
    code = textwrap.dedent("""
        import sys
        import runtime, runtime.__main__, runtime.executors.aoti
        bad = sorted(m for m in sys.modules
                     if m.split('.')[0] in ('exporter', 'passes', 'plan', 'targets'))
        print(bad)
        sys.exit(1 if bad else 0)
    """)
    proc = ran(subprocess.run, [sys.executable, "-c", code], cwd=ROOT, capture_output=True,
               text=True)
    assert proc.returncode == 0, f"runtime imported upper rooms: {proc.stdout} {proc.stderr}"


def test_every_runtime_module_is_one_a_device_runs():
    """runtime/ holds only what a device runs: each of its modules is imported, at module
    level, in a function or through the executors' registry, by what loading an artifact
    (``runtime``) or ``python -m runtime`` (run, generate, run-cases) reaches. What only
    the build uses (the artifact writer, generation validation's cases, sweeping
    leftovers) lives above, in exporter/."""
    graph = _import_graph()
    reached = {"runtime", "runtime.__main__"}
    for root in tuple(reached):
        reached |= _reachable(graph, root)
    # a package's __init__ runs whenever a module below it is imported
    reached |= {".".join(m.split(".")[:i]) for m in reached for i in range(1, m.count(".") + 1)}
    assert "runtime.executors.aoti" in reached  # registry strings count as imports
    unused = sorted(m for m in graph if m.split(".")[0] == "runtime" and m not in reached)
    assert not unused, f"runtime modules that no device path imports (build-only?): {unused}"


ROOMS = ("runtime", "passes", "plan", "targets", "exporter")  # bottom to top: imports go down only
TOOLS = ("bench",)  # above every room: may import any of them, in no circle, and none imports them
_DYNAMIC = ("import_module", "__import__")  # importlib.import_module("x"), __import__("x")
# a project module's dotted name as a string, "module" or "module:attribute": what a
# registry keeps and imports by variable
_IMPORT_STRING = re.compile(rf"(?:{'|'.join(ROOMS + TOOLS)})(?:\.\w+)+(?::\w+)?")


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
            for room in ROOMS + TOOLS for p in (ROOT / room).rglob("*.py")}


def _named_imports(path: Path) -> set[str]:
    """Every module one file names in an import: ``import x``, ``from x import y`` (top
    level, under TYPE_CHECKING or inside a function alike: each can close a circle), and
    string literals given to ``importlib.import_module`` or ``__import__``."""
    import ast
    named = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (this check reads absolute)"
            named |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in _DYNAMIC and isinstance(node.args[0].value, str):
                named.add(node.args[0].value.split(":")[0])
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and _IMPORT_STRING.fullmatch(node.value)):
            # "targets.onnx.target:OnnxTarget" in a registry, imported later by variable
            named.add(node.value.split(":")[0])
    return named


@functools.cache  # read by six tests: parsing every file took 0.9 CPU s each time
def _import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports. ``from pkg import sub`` is an edge to
    ``pkg.sub`` alone: the package's __init__ runs first for any import below it, which
    is not an edge between modules."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        named = _named_imports(path)
        named -= {n for n in named if any(m.startswith(n + ".") for m in named & modules.keys())}
        graph[name] = named & modules.keys()
    return graph


def test_each_room_imports_only_the_rooms_below_it():
    """runtime imports no other room; passes neither plan, targets nor exporter; plan
    neither targets nor exporter; targets not exporter; no room imports bench: including
    imports inside functions and through importlib."""
    floors = ROOMS + TOOLS
    bad = [(module, target) for module, names in _import_graph().items() for target in names
           if floors.index(target.split(".")[0]) > floors.index(module.split(".")[0])]
    assert not bad, f"imports going up a room: {bad}"


def test_the_layering_check_sees_importlib_imports(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import importlib\n"
                      "def f():\n    return importlib.import_module('exporter.settings')\n"
                      "PLUGINS = ('exporter.bench:Baseline',)\n"
                      "def g(line):\n    return importlib.import_module(line.split(':')[0])\n")
    assert {"exporter.settings", "exporter.bench"} <= _named_imports(sample)


def test_no_import_circles():
    """Over every room and bench/ alike."""
    graph = _import_graph()
    circles = sorted(m for m in graph if m in _reachable(graph, m))
    assert not circles, f"modules that import themselves back: {circles}"


def test_the_circle_check_reads_bench():
    """bench/llm's engines and the registry that names them once imported each other; the
    shared types now live in bench.llm.engine, which both import."""
    graph = _import_graph()
    assert "bench.llm.engine" in graph["bench.llm.registry"]
    assert "bench.llm.registry" not in graph["bench.llm.engines_hf"]


def _exporter_imports() -> dict[str, set[str]]:
    return {m: {n for n in names if n.startswith("exporter")}
            for m, names in _import_graph().items() if m.startswith("exporter")}


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), list(graph[start])
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    return seen


def test_accuracy_gates_close_no_circle_with_builder():
    """The gates are a leaf both validation and builder/quantization.py use; validation
    itself reaches nothing of builder/, so quantization.py never comes back to itself."""
    graph = _exporter_imports()
    assert _reachable(graph, "exporter.validation.gates") == set()
    assert not {m for m in _reachable(graph, "exporter.validation.validate")
                if m.startswith("exporter.builder")}
    assert "exporter.builder.quantization" not in _reachable(graph,
                                                             "exporter.builder.quantization")


def test_gates_load_with_the_rest_of_exporter_unimportable(ran):
    """Loaded by path with ``exporter`` blocked, gates.py must still import: it uses
    nothing of exporter (so nothing of builder/) at import time."""
    code = textwrap.dedent("""
        import importlib.util, sys
        sys.modules['exporter'] = None  # any `import exporter...` now raises ImportError
        spec = importlib.util.spec_from_file_location('gates', 'exporter/validation/gates.py')
        gates = sys.modules['gates'] = importlib.util.module_from_spec(spec)  # dataclasses
        spec.loader.exec_module(gates)
        print(gates.Tolerance.for_dtype('fp16').describe())
    """)
    proc = ran(subprocess.run, [sys.executable, "-c", code], cwd=ROOT, capture_output=True,
               text=True)
    assert proc.returncode == 0, proc.stderr
    assert "10 x max|eager - ref|" in proc.stdout


# What a device without torch imports: loading and running an artifact whose partitions
# all run on ONNX Runtime or TVM (runtime/program/requires.py), and `python -m runtime run`.
TORCH_FREE_ROOTS = ("runtime", "runtime.__main__", "runtime.program.array_program",
                    "runtime.executors.onnxruntime", "runtime.executors.tvm")
_TORCH = ("torch", "safetensors.torch")


def _module_level_imports(path: Path) -> set[str]:
    """The modules a file imports when it is imported: statements of the module body, of
    top-level ``if``/``try``/``with`` blocks and class bodies; not function bodies (run
    later, where a partition needs them) nor ``if TYPE_CHECKING:`` blocks."""
    import ast
    named: set[str] = set()

    def visit(statements: list) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                named.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                named.update({node.module, *(f"{node.module}.{a.name}" for a in node.names)})
            elif isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, *(h.body for h in node.handlers), node.orelse,
                              node.finalbody):
                    visit(block)
            elif isinstance(node, (ast.With, ast.ClassDef)):
                visit(node.body)

    visit(ast.parse(path.read_text()).body)
    return named


def _torch_at_import(roots: tuple[str, ...]) -> list[tuple[str, str]]:
    """(module, what it imports) for each torch import at module level in the modules
    importing ``roots`` runs (the packages above each module run first, so they count)."""
    modules = _modules()
    seen, todo, found = set(), list(roots), []
    while todo:
        name = todo.pop()
        if name in seen or name not in modules:
            continue
        seen.add(name)
        todo.extend(".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1))
        named = _module_level_imports(modules[name])
        found += [(name, n) for n in sorted(named)
                  if any(n == t or n.startswith(t + ".") for t in _TORCH)]
        todo.extend(n for n in named if n in modules)
    return found


def test_an_onnx_or_tvm_load_imports_no_torch_at_module_level():
    """A device with only ONNX Runtime (or TVM) and numpy imports these modules; one
    module-level `import torch` among them and the runtime does not start there."""
    assert _torch_at_import(TORCH_FREE_ROOTS) == []


def test_the_torch_import_check_sees_module_level_imports(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from typing import TYPE_CHECKING\n"
                      "try:\n    import torch.nn\nexcept ImportError:\n    pass\n"
                      "if TYPE_CHECKING:\n    import safetensors.torch\n"
                      "def f():\n    import torch\n")
    assert _module_level_imports(sample) & {"torch", "torch.nn", "safetensors.torch"} == {
        "torch.nn"}
    assert _torch_at_import(("runtime.program.torch_program",)) != []  # the torch Program: it does


def test_the_runtime_imports_with_torch_blocked(ran):
    """The same modules, imported for real in a process where `import torch` fails."""
    code = textwrap.dedent(f"""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] == 'torch':
                    raise ImportError('torch is blocked')
        sys.meta_path.insert(0, Block())
        for name in {TORCH_FREE_ROOTS!r}:
            __import__(name)
        print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))
    """)
    proc = ran(subprocess.run, [sys.executable, "-c", code], cwd=ROOT, capture_output=True,
               text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr


def test_loading_every_target_loads_no_exporter_module(ran):
    """The registry imports targets by name at run time: what they load is checked live."""
    code = ("import sys\nfrom targets import all_targets\nprint(sorted(all_targets()))\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'exporter')\n"
            "print(bad)\nsys.exit(1 if bad else 0)\n")
    proc = ran(subprocess.run, [sys.executable, "-c", code], cwd=ROOT, capture_output=True,
               text=True)
    assert proc.returncode == 0, f"targets loaded exporter modules: {proc.stdout} {proc.stderr}"


def test_the_exporter_rooms_import_each_other_in_one_direction():
    """exporter/'s folders (model, builder, validation, report, ship, cli, config, matrix,
    lm) form no circle: whichever of two imports the other, not both (a module on its
    own, such as exporter.settings, belongs to no folder)."""
    def room(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if parts[0] == "exporter" and len(parts) > 2 else None
    edges: dict[str, set[str]] = {}
    for module, names in _import_graph().items():
        for name in names:
            a, b = room(module), room(name)
            if a and b and a != b:
                edges.setdefault(a, set()).add(b)
    both = sorted((a, b) for a in edges for b in edges[a] if a < b and a in edges.get(b, ()))
    assert not both, f"folders importing each other: {both}"
    # and no longer circle: a depth-first search over the folders
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in edges.get(node, ()):
            assert state.get(nxt) != 1, f"circle: {' -> '.join(path + [node, nxt])}"
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2
    for node in list(edges):
        if node not in state:
            visit(node, [])


def test_only_the_build_kinds_ask_whether_a_build_generates():
    """One pipeline: the task and an artifact's generation section choose the build kind in
    exporter/kinds.py alone; every other part asks the kind, never the task again."""
    from exporter.api import build_kind, kind_of
    from exporter.settings import BuildSettings
    asks = re.compile(r"\.task\s*[!=]=\s*['\"]text-generation|\.generation\s+is\s+(not\s+)?None")
    askers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "exporter").rglob("*.py")
                    if asks.search(p.read_text()))
    # the report draws the generation section it finds (data, not a pipeline branch)
    assert askers == ["exporter/kinds.py", "exporter/report/html.py"], askers
    assert build_kind(BuildSettings(task="text-generation")).name == "generating"
    assert build_kind(BuildSettings()).name == "plain"
    assert kind_of(type("M", (), {"generation": {"cache": {}}})()).makes_own_inputs
