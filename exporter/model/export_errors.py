"""Turn a torch.export failure into one readable ``ExportFailedError``.

torch.export (non-strict, the default) runs the model's Python code on fake tensors,
so most failures surface as one of a few exception kinds (found with torch 2.13):

- ``GuardOnDataDependentSymNode`` (torch.fx.experimental.symbolic_shapes): Python needed
  a concrete bool/int from tensor data. ``exc.cond`` holds the guard (``Eq(u0, 1)``); the
  model's own frame is in the traceback because the code really ran. Raised for
  data-dependent control flow (``if x.sum() > 0:``) and for ops on data-dependent shapes
  (``x.nonzero().view(2, -1)``); the message may suggest ``torch._check(...)`` lines.
- ``torch._dynamo.exc.UserError`` with ``error_type == CONSTRAINT_VIOLATION`` (chained from
  ``ConstraintViolationError``): a dim marked dynamic was specialized. It is raised after
  tracing, so no model frame is in the traceback; the message lists the violated guards
  and "Suggested fixes:". The guards' source locations live only on the ShapeEnv.
- ``UnsupportedOperatorException`` (torch._subclasses.fake_tensor): an op with no
  fake/meta kernel; ``exc.func`` is the OpOverload.
- Plain ``RuntimeError``s raised in the model's code, e.g. ``.numpy()`` or
  ``data_ptr()`` on a fake tensor: Python constructs that cannot be traced.

Whatever the kind, the user's source line is taken from, in order: the traceback, a
``File "...", line N`` in the message, a ``(file.py:N in fn)`` in the message, and the
ShapeEnv guards. Torch's own first line always goes to ``details`` so nothing is lost.
"""

from __future__ import annotations

import linecache
import os
import re
import sysconfig
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from exporter.errors import ExportFailedError

_TORCH_DIR = str(Path(torch.__file__).parent) + os.sep
_STDLIB_DIR = str(Path(sysconfig.get_paths()["stdlib"]).resolve()) + os.sep
_PROJECT = Path(__file__).resolve().parents[2]  # the repository: exporter/model/ is two down
# Our own rooms are never "the user's code", even when they sit on the stack.
_TOOLCHAIN_DIRS = tuple(str(_PROJECT / d) + os.sep for d in ("exporter", "runtime", "passes",
                                                              "targets"))
_ZOO_FILE = str(_PROJECT / "exporter" / "model" / "zoo.py")  # the zoo's models are model code
# Frameworks whose frames are never the model's fault.
_FRAMEWORKS = ("torch", "torchgen", "functorch", "sympy", "typing_extensions")

MAX_GUARDS_SHOWN = 3


@dataclass(frozen=True)
class SourceLine:
    """One line of the user's source: where an error points."""

    file: str
    line: int
    function: str = ""
    code: str = ""

    def __str__(self) -> str:
        text = f"{_display_path(self.file)}:{self.line}"
        if self.function:
            text += f" in {self.function}"
        return text + (f": `{self.code}`" if self.code else "")


# ---------------------------------------------------------------------------- locating user code


def _display_path(path: str) -> str:
    """Relative to the working directory when inside it: shorter and clickable."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return path
    return path if rel.startswith("..") else rel


def _is_site_packages(path: str) -> bool:
    return f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path


def _is_framework(path: str) -> bool:
    if path.startswith(_TORCH_DIR):
        return True
    return any(f"-packages{os.sep}{name}{os.sep}" in path for name in _FRAMEWORKS)


def is_model_code(path: str) -> bool:
    """True for code a user wrote or installed (e.g. transformers), not torch or Python."""
    if not path or path.startswith("<") or _is_framework(path):
        return False
    if path.startswith(_TOOLCHAIN_DIRS) and path != _ZOO_FILE:
        return False
    return not (path.startswith(_STDLIB_DIR) and not _is_site_packages(path))


def _source_line(file: str, line: int, function: str = "") -> SourceLine:
    return SourceLine(file, line, function, linecache.getline(file, line).strip())


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """exc, then what caused it, without looping on cyclic chains."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def find_user_frame(exc: BaseException, *, skip_to_torch: bool = False) -> SourceLine | None:
    """Innermost frame of the user's code in exc's traceback (or its causes).

    User files outside site-packages win over installed model libraries. With
    ``skip_to_torch``, frames before the first torch frame are ignored: they belong to
    whoever called torch.export, which is never the model.
    """
    frames = []
    for e in exception_chain(exc):
        stack = traceback.extract_tb(e.__traceback__)
        if skip_to_torch:
            first = next((i for i, fs in enumerate(stack) if _is_framework(fs.filename)), None)
            stack = stack[first:] if first is not None else []
        frames.extend(reversed(stack))  # innermost first
    candidates = [fs for fs in frames if is_model_code(fs.filename)]
    ours = [fs for fs in candidates if not _is_site_packages(fs.filename)]
    best = (ours or candidates or [None])[0]
    return _source_line(best.filename, best.lineno, best.name) if best else None


_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)(?:, in (\w+))?')
_SHORT_LOC = re.compile(r"\(([^()\s]+\.py):(\d+) in (\w+)\)")


def _location_in_message(message: str, origin_file: str | None) -> SourceLine | None:
    """torch puts user locations in messages: full 'File "x", line N' or a short '(x.py:N in f)'."""
    full = _last_model_frame(message)
    if full:
        return full
    for short, line, func in reversed(_SHORT_LOC.findall(message)):
        # the short form is truncated ("mp/exp/model.py"): only trust it when it is the origin
        if origin_file and origin_file.endswith(short):
            return _source_line(origin_file, int(line), func)
    return None


def _guard_locations(exc: BaseException) -> list[tuple[SourceLine, str]]:
    """User lines that placed shape guards, read off the ShapeEnv in the failing frames.

    A constraint violation is raised after tracing, so no user frame is on its
    traceback; the ShapeEnv that produced the guards is, with each guard's location.
    These are torch internals: anything unexpected yields nothing rather than a crash.
    """
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    found: dict[SourceLine, str] = {}
    for env in _frame_locals(exc, ShapeEnv):
        for guard in getattr(env, "guards", []):
            loc = getattr(getattr(guard, "sloc", None), "framework_loc", None)
            expr = getattr(guard, "expr", None)
            if not isinstance(loc, traceback.FrameSummary) or not is_model_code(loc.filename):
                continue
            if getattr(expr, "free_symbols", None):
                found.setdefault(_source_line(loc.filename, loc.lineno, loc.name), str(expr))
    return list(found.items())


def _graph_location(exc: BaseException) -> SourceLine | None:
    """The first traced op that divides a dynamic size (``view(4, -1)`` gives ``s0//4``).

    Guards placed inside torch ops (view, reshape) carry torch's location, not the user's.
    The traced graph is still in the failing frames; the op whose output size stops
    being a polynomial of the dims is the one that split the dim, and its
    ``stack_trace`` names the user's line.
    """
    for gm in _frame_locals(exc, torch.fx.GraphModule):
        for node in gm.graph.nodes:
            if node.op == "call_function" and _divides_a_dim(node.meta.get("val")):
                loc = _last_model_frame(node.meta.get("stack_trace") or "")
                if loc:
                    return loc
    return None


def _divides_a_dim(val: object) -> bool:
    sizes = val.shape if isinstance(val, torch.Tensor) else [val]
    for size in sizes:
        expr = getattr(getattr(size, "node", None), "expr", None)
        if expr is not None and expr.free_symbols and not expr.is_polynomial(*expr.free_symbols):
            return True
    return False


def _last_model_frame(stack_trace: str) -> SourceLine | None:
    for file, line, func in reversed(_FILE_LINE.findall(stack_trace)):
        if is_model_code(file):
            return _source_line(file, int(line), func)
    return None


def _frame_locals(exc: BaseException, kind: type) -> Iterator:
    """Objects of ``kind`` held by the frames an exception passed through (each once)."""
    seen: set[int] = set()
    for e in exception_chain(exc):
        tb = e.__traceback__
        while tb is not None:
            for value in list(tb.tb_frame.f_locals.values()):
                if isinstance(value, kind) and id(value) not in seen:
                    seen.add(id(value))
                    yield value
            tb = tb.tb_next


def locate(exc: BaseException, origin_file: str | None) -> SourceLine | None:
    return (find_user_frame(exc, skip_to_torch=True)
            or _location_in_message(str(exc), origin_file)
            or next(iter(loc for loc, _ in _guard_locations(exc)), None)
            or (_graph_location(exc) if _is_constraint_violation(exc) else None))


# ---------------------------------------------------------------------------- classifying


@dataclass
class _Explanation:
    what: str
    hint: str
    details: list[str]
    where_fallback: str | None = None  # when no source line is known (e.g. "input x dim 0")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else "(no message)"
    return f"{type(exc).__name__}: {line}"


def _find(exc: BaseException, type_name: str) -> BaseException | None:
    return next((e for e in exception_chain(exc) if type(e).__name__ == type_name), None)


_CONTROL_FLOW_LINE = re.compile(r"^(if|elif|while|assert)\b|\bif\b.+\belse\b")
_CHECK_SUGGESTION = re.compile(r"^\s*\d+\.\s+(torch\._check\(.*\))\s*$", re.M)
_DATA_DEP_COND = re.compile(r"data-dependent expression (.+?) \(unhinted")


def _data_dependent(exc: BaseException, where: SourceLine | None) -> _Explanation | None:
    guard_exc = _find(exc, "GuardOnDataDependentSymNode")
    message = str(guard_exc or exc)
    match = _DATA_DEP_COND.search(message)
    if guard_exc is None and match is None:
        return None
    cond = getattr(guard_exc, "cond", None)  # a sympy expr: no truth value, test for None
    if cond is None:
        cond = match.group(1) if match else "?"
    checks = _CHECK_SUGGESTION.findall(message)
    if where and _CONTROL_FLOW_LINE.search(where.code):
        library = _installed_package(where.file)
        return _Explanation(
            f"The model branches on tensor data (data-dependent control flow), which "
            f"torch.export cannot capture: the condition `{cond}` is unknown while tracing",
            # a branch in transformers' own code is not the user's to rewrite
            f"the branch is in the {library} package's code for this model, not yours: it "
            "cannot be captured as it is; look for a config option that avoids that branch, "
            "or report the line above" if library else
            "rewrite the branch with torch.cond(pred, true_fn, false_fn, operands) so both "
            "sides are captured, or move the decision out of the model and export one fixed "
            "branch", [])
    hint = ("tell torch.export what holds with torch._check before that line"
            + (f", e.g. {' or '.join(f'`{c}`' for c in checks)}" if checks else "")
            + "; for a size computed with .item(), add torch._check_is_size(n) (and "
            "torch._check(n <= MAX) when an upper bound is known)")
    return _Explanation(
        f"A shape depends on tensor data (data-dependent shape), and torch.export cannot "
        f"decide `{cond}` for it while tracing", hint, [f"suggested by torch: {c}" for c in checks])


def _installed_package(file: str) -> str | None:
    """The installed package a source file belongs to (``transformers``), or None for the
    user's own code."""
    parts = Path(file).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts and parts.index(marker) + 1 < len(parts):
            return parts[parts.index(marker) + 1]
    return None


_LOCAL_NAME = re.compile(r"L\['(\w+)'\]")
_CONSTANT = re.compile(r"specialized it to be a constant \((-?\d+)\)")
_DIM_SOURCE = re.compile(r"Not all values of (\w+) = (\w+\.size\(\)\[\d+\])")


def _is_constraint_violation(exc: BaseException) -> bool:
    for e in exception_chain(exc):
        kind = getattr(getattr(e, "error_type", None), "name", "")
        if type(e).__name__ == "ConstraintViolationError" or kind == "CONSTRAINT_VIOLATION":
            return True
    return str(exc).startswith("Constraints violated")


def _suggested_fixes(message: str) -> list[str]:
    _, found, rest = message.partition("Suggested fixes:")
    if not found:
        return []
    fixes = []
    for line in rest.splitlines()[1:]:
        if not line.startswith(" ") or not line.strip():
            break
        fixes.append(line.strip())
    return fixes


def _specialized_dim(exc: BaseException, where: SourceLine | None) -> _Explanation | None:
    if not _is_constraint_violation(exc):
        return None
    message = _LOCAL_NAME.sub(r"\1", str(exc))
    dims = re.search(r"Constraints violated \(([^)]*)\)", message)
    dim_names = dims.group(1) if dims else "a dynamic dim"
    bullets = [line.strip()[2:] for line in message.splitlines() if line.startswith("  - ")]
    fixes = _suggested_fixes(message)
    constant = _CONSTANT.search(message)
    if constant:
        what = (f"The model specializes dynamic dim {dim_names}: its code only works when the "
                f"dim is {constant.group(1)}")
        hint = (f"make that dim static (drop it from --dynamic), or remove the shape check that "
                f"fixes it to {constant.group(1)}")
    else:
        what = (f"The model specializes dynamic dim {dim_names}: its code does not work for every "
                f"size in the declared range")
        hint = "adjust the dim's bounds or drop it from --dynamic"
    if fixes:
        hint = f"apply torch's suggested fix `{'; '.join(fixes)}`, or {hint}"
    shown = bullets[:MAX_GUARDS_SHOWN]
    if len(bullets) > len(shown):
        shown.append(f"... and {len(bullets) - len(shown)} more violated guards")
    extra = [f"{loc}: guard `{expr}`" for loc, expr in _guard_locations(exc) if loc != where]
    source = _DIM_SOURCE.search(message)
    fallback = f"dynamic dim {source.group(1)} = {source.group(2)}" if source else None
    return _Explanation(what, hint, shown + extra, fallback)


_UNTRACEABLE = re.compile(r"data pointer|\.numpy\(\)|tensor subclass|FakeTensor|FunctionalTensor")
_NO_FAKE_IMPL = re.compile(r"no fake impl registered for <CustomOpDef\(([\w.:]+)\)>")


def _op_without_fake_kernel(exc: BaseException) -> str | None:
    """The qualified name ("ns::op") of an op torch could not run on fake tensors."""
    op_exc = _find(exc, "UnsupportedOperatorException") or _find(exc, "DynamicOutputShapeException")
    if op_exc is not None:  # exc.func is an OpOverload: "ns.op.overload"
        namespace, _, rest = str(getattr(op_exc, "func", None) or op_exc.args[0]).partition(".")
        return f"{namespace}::{rest.split('.')[0]}"
    custom = _NO_FAKE_IMPL.search(str(exc))  # torch.library.custom_op without register_fake
    return custom.group(1) if custom else None


def _unsupported(exc: BaseException, where: SourceLine | None) -> _Explanation | None:
    op = _op_without_fake_kernel(exc)
    if op is not None:
        return _Explanation(
            f"Operator {op} has no fake (meta) kernel, so torch.export cannot work out its "
            "output shapes",
            f"register one with @torch.library.register_fake(\"{op}\") that returns empty "
            "tensors of the right shapes, or replace the op", [])
    if _find(exc, "Unsupported") is None and not _UNTRACEABLE.search(str(exc)):
        return None  # "Unsupported" is dynamo's (strict mode) own error
    return _Explanation(
        "The model uses a Python construct torch.export cannot trace: it needs real tensor "
        "data (numpy, data pointers) or Python features the tracer does not support",
        "express it with torch operations (no numpy, .tolist() or data_ptr() on inputs), "
        "wrap it in a custom op with torch.library.custom_op, or move it out of forward()", [])


def _generic(exc: BaseException, where: SourceLine | None) -> _Explanation:
    return _Explanation(
        f"torch.export failed with {type(exc).__name__} while capturing the model",
        "check that the model runs eagerly on the example inputs; "
        "torch.export.draft_export(model, args) lists every problem at once", [])


# Each takes (exc, where) and returns None when the failure is not its kind; the first
# that recognizes it wins, and _generic explains the rest.
_CLASSIFIERS = (_specialized_dim, _data_dependent, _unsupported)


def _where_unknown(explanation: _Explanation, origin_file: str | None) -> str | None:
    model = f"the model from {_display_path(origin_file)}" if origin_file else None
    if explanation.where_fallback:
        return f"{explanation.where_fallback} of {model or 'the model'} (no source line known)"
    return f"{model} (no source line found)" if model else None


def explain_export_failure(exc: BaseException, origin_file: str | None) -> ExportFailedError:
    """One ExportFailedError naming the construct, the user's line, the guard and a fix."""
    where = locate(exc, origin_file)
    explanation = None
    for classify in _CLASSIFIERS:
        explanation = classify(exc, where)
        if explanation is not None:
            break
    explanation = explanation or _generic(exc, where)
    where_text = str(where) if where else _where_unknown(explanation, origin_file)
    error = ExportFailedError(explanation.what, where=where_text, hint=explanation.hint,
                              details=[f"torch said: {_first_line(exc)}", *explanation.details])
    error.__cause__ = exc  # the full torch message stays reachable (--debug shows it)
    return error
