"""The runtime is the bottom floor: importing it must not pull in exporter, passes or targets."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_runtime_imports_no_upper_room(ran):
    code = textwrap.dedent("""
        import sys
        import runtime, runtime.__main__, runtime.executors.aoti
        bad = sorted(m for m in sys.modules
                     if m.split('.')[0] in ('exporter', 'passes', 'targets'))
        print(bad)
        sys.exit(1 if bad else 0)
    """)
    proc = ran(subprocess.run, [sys.executable, "-c", code], cwd=ROOT, capture_output=True,
               text=True)
    assert proc.returncode == 0, f"runtime imported upper rooms: {proc.stdout} {proc.stderr}"


def test_runtime_sources_never_import_upper_rooms():
    for path in (ROOT / "runtime").rglob("*.py"):
        text = path.read_text()
        for room in ("exporter", "passes", "targets"):
            assert f"import {room}" not in text and f"from {room}" not in text, (path, room)


def test_passes_do_not_import_targets_or_exporter():
    for path in (ROOT / "passes").rglob("*.py"):
        text = path.read_text()
        for room in ("exporter", "targets"):
            assert f"from {room}" not in text and f"import {room}" not in text, (path, room)


def _exporter_imports() -> dict[str, set[str]]:
    """Module -> the exporter modules it names in any import statement (top level, under
    TYPE_CHECKING or inside a function alike: each can close a circle). Implicit imports of
    parent packages' __init__ are left out: they are not edges between rooms."""
    import ast
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for p in (ROOT / "exporter").rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        named = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                named |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path}: relative import (this check reads absolute)"
                named |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        graph[name] = named & modules.keys()
    return graph


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
