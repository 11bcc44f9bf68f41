"""What ``forward()`` must take and return for torch.export, said in the user's terms.

Two mistakes torch words in its own terms, with no way out named: example inputs that
do not fit ``forward()``'s parameters (a keyword-only ``forward(self, x, *, scale)`` fed
positionally: "too many positional arguments"), and an output class torch's pytree does
not know (a plain ``@dataclass``: "Found <class ...> in output, which is not a known
type"). Each becomes a SpecError pointing at the user's source with the fix.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from typing import Any

import torch

from exporter.errors import SpecError
from exporter.model.source_lines import SourceLine, exception_chain

_KWARGS_HINT = ("from a factory: `return model, (x,), {{{example}}}` (the third element is "
                "forward()'s keyword args); in Python: exporter.build(model, (x,), "
                "example_kwargs={{{example}}})")


def check_call(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """Refuse example inputs that ``forward()`` cannot be called with, before tracing."""
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):  # a builtin or C++ forward: nothing to read
        return
    try:
        signature.bind(*args, **kwargs)
        return
    except TypeError as exc:
        problem = str(exc)
    where = _where(type(module).forward)
    keyword_only = [name for name, p in signature.parameters.items()
                    if p.kind is p.KEYWORD_ONLY and p.default is p.empty and name not in kwargs]
    if keyword_only:
        example = ", ".join(f"'{name}': ..." for name in keyword_only)
        raise SpecError(
            f"forward() takes {', '.join(repr(n) for n in keyword_only)} by keyword only "
            f"(after `*`), and the example inputs do not give it by name ({problem})",
            where=where, hint="pass it as an example keyword argument, "
                              + _KWARGS_HINT.format(example=example))
    raise SpecError(f"forward{signature} cannot take the example inputs ({problem})",
                    where=where, hint="give one example input per parameter, in order; "
                    "keyword arguments go by name, "
                    + _KWARGS_HINT.format(example="'name': tensor"))


_UNKNOWN_OUTPUT = re.compile(r"Found <class '([\w.]+)'> in output, which is not a known type")


def unregistered_output(exc: BaseException) -> SpecError | None:
    """torch.export's failure on an output class its pytree cannot flatten, as a fix: a
    dataclass is one registration away; any other class needs flatten/unflatten."""
    match = next((m for e in exception_chain(exc)
                  if (m := _UNKNOWN_OUTPUT.search(str(e)))), None)
    if match is None:
        return None
    cls = _resolve(match.group(1))
    name = cls.__qualname__ if cls is not None else match.group(1).rsplit(".", 1)[-1]
    where = _where(cls) if cls is not None else None
    if cls is not None and dataclasses.is_dataclass(cls):
        fields = ", ".join(f.name for f in dataclasses.fields(cls))
        hint = (f"register it once, after the class: `torch.utils._pytree.register_dataclass"
                f"({name})` (the artifact's outputs are then its fields: {fields}), or "
                "return a tuple or dict of tensors")
    else:
        hint = (f"register it with `torch.utils._pytree.register_pytree_node({name}, "
                "flatten_fn, unflatten_fn)`, or return a tuple, dict or NamedTuple of tensors")
    error = SpecError(f"the model returns {name}, a class torch.export cannot look inside "
                      "(its pytree does not know it)", where=where, hint=hint,
                      details=[f"torch said: {match.group(0)}"])
    error.__cause__ = exc
    return error


def _resolve(dotted: str) -> type | None:
    """The class named ``module.Qual.Name``, from the modules already imported."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        found: Any = sys.modules.get(".".join(parts[:cut]))
        for attribute in parts[cut:]:
            found = getattr(found, attribute, None)
        if isinstance(found, type):
            return found
    return None


def _where(obj: Any) -> str | None:
    try:
        file = inspect.getsourcefile(obj)
        lines, line = inspect.getsourcelines(obj)
    except (TypeError, OSError):
        return None
    # the `class`/`def` line itself, not a decorator above it
    offset = next((i for i, text in enumerate(lines)
                   if text.lstrip().startswith(("class ", "def "))), 0)
    return str(SourceLine(file, line + offset, "", lines[offset].strip())) if file else None
