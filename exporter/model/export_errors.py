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

import re
from dataclasses import dataclass

from exporter.errors import ExportFailedError
from exporter.model.source_lines import (MAX_GUARDS_SHOWN, SourceLine, display_path,
                                         exception_chain, find_user_frame, graph_location,
                                         guard_locations, installed_package,
                                         location_in_message, toolchain_frame)

def locate(exc: BaseException, origin_file: str | None) -> SourceLine | None:
    return (find_user_frame(exc, skip_to_torch=True)
            or location_in_message(str(exc), origin_file)
            or next(iter(loc for loc, _ in guard_locations(exc)), None)
            or (graph_location(exc) if _is_constraint_violation(exc) else None))


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


# a loop over a tensor's rows (DBRX's ``for expert_idx in expert_hit:``) runs as many
# times as the data says: control flow too
_CONTROL_FLOW_LINE = re.compile(r"^(if|elif|while|assert|for)\b|\bif\b.+\belse\b")
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
    library = installed_package(where.file) if where else None  # not the user's to edit
    if where and _CONTROL_FLOW_LINE.search(where.code):
        return _Explanation(
            f"The model branches on tensor data (data-dependent control flow), which "
            f"torch.export cannot capture: the condition `{cond}` is unknown while tracing",
            f"the branch is in the {library} package's code for this model, not yours: it "
            "cannot be captured as it is; look for a config option that avoids that branch, "
            "or report the line above" if library else
            "rewrite the branch with torch.cond(pred, true_fn, false_fn, operands) so both "
            "sides are captured, or move the decision out of the model and export one fixed "
            "branch", [])
    if library:
        return _Explanation(
            f"A shape depends on tensor data (data-dependent shape) in the {library} "
            f"package's code for this model, and torch.export cannot decide `{cond}` for it "
            "while tracing",
            f"the line above is {library}'s, not yours: look for a config option or an "
            "implementation switch that avoids it (for a transformers mixture of experts, "
            "a newer transformers whose experts take set_experts_implementation), or report "
            "the line", [f"suggested by torch: {c}" for c in checks])
    hint = ("tell torch.export what holds with torch._check before that line"
            + (f", e.g. {' or '.join(f'`{c}`' for c in checks)}" if checks else "")
            + "; for a size computed with .item(), add torch._check_is_size(n) (and "
            "torch._check(n <= MAX) when an upper bound is known)")
    return _Explanation(
        f"A shape depends on tensor data (data-dependent shape), and torch.export cannot "
        f"decide `{cond}` for it while tracing", hint, [f"suggested by torch: {c}" for c in checks])


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
    if constant and constant.group(1) in ("0", "1"):
        # torch's own fix (`batch = 1`) would undo what was asked
        fixes = []
        what = (f"torch.export made dynamic dim {dim_names} the constant {constant.group(1)}: "
                f"the example inputs have size {constant.group(1)} there (a dim whose example "
                f"is 0 or 1 is always made a constant), or the model's code fixes it")
        hint = ("give example inputs of size 2 or more on that dim (the artifact still takes "
                "every size in the range; hf: specs make their own: --dynamic batch=1..N); if "
                "they are, remove the shape check that fixes it")
    elif constant:
        what = (f"The model specializes dynamic dim {dim_names}: its code only works when the "
                f"dim is {constant.group(1)}")
        hint = (f"make that dim static (drop it from --dynamic), or remove the shape check that "
                f"fixes it to {constant.group(1)}")
    elif not fixes and re.search(r"generated guard .*%", message):
        # a remainder torch suggests no dim for (XLNet's relative shift: `(2*s - 1) % s != 0`,
        # true for every s >= 2) is past its range analysis: no bounds make it provable
        what = (f"torch.export cannot prove a guard of dynamic dim {dim_names} over its range: "
                f"the guard takes a remainder (%), which torch cannot bound from a range")
        hint = "drop the dim from --dynamic (an artifact per size): other bounds do not help"
    else:
        what = (f"The model specializes dynamic dim {dim_names}: its code does not work for every "
                f"size in the declared range")
        hint = "adjust the dim's bounds or drop it from --dynamic"
    if fixes:
        hint = f"apply torch's suggested fix `{'; '.join(fixes)}`, or {hint}"
    shown = bullets[:MAX_GUARDS_SHOWN]
    if len(bullets) > len(shown):
        shown.append(f"... and {len(bullets) - len(shown)} more violated guards")
    extra = [f"{loc}: guard `{expr}`" for loc, expr in guard_locations(exc) if loc != where]
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


def _in_the_exporter(exc: BaseException, where: SourceLine | None) -> _Explanation | None:
    """Raised in our own code (the generating step's attention, a wrapper): not the
    model's fault, and "check that it runs eagerly" would send the user the wrong way."""
    ours = toolchain_frame(exc)
    if ours is None:
        return None
    called = f" (called from {where})" if where else ""
    return _Explanation(
        f"the exporter's own code failed while capturing this model, at {ours}{called}",
        "this is a gap in the exporter, not in the model: --debug shows the traceback; "
        "please report it with the model's config", [])


def _generic(exc: BaseException, where: SourceLine | None) -> _Explanation:
    return _Explanation(
        f"torch.export failed with {type(exc).__name__} while capturing the model",
        "check that the model runs eagerly on the example inputs; "
        "torch.export.draft_export(model, args) lists every problem at once", [])


# Each takes (exc, where) and returns None when the failure is not its kind; the first
# that recognizes it wins, and _generic explains the rest.
_CLASSIFIERS = (_specialized_dim, _data_dependent, _unsupported, _in_the_exporter)


def _where_unknown(explanation: _Explanation, origin_file: str | None) -> str | None:
    model = f"the model from {display_path(origin_file)}" if origin_file else None
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
