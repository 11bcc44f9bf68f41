"""Where an error or a graph node points in the user's code: a ``SourceLine``, found in a
traceback (the innermost frame of model code, not torch's, this toolchain's or the standard
library's), in an exception's message, in torch.export's shape guards, or in a node's
stack trace (the line the build's tables, the bisect and the errors name)."""

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
from torch.fx import Node

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
        text = f"{display_path(self.file)}:{self.line}"
        if self.function:
            text += f" in {self.function}"
        return text + (f": `{self.code}`" if self.code else "")


# ---------------------------------------------------------------------------- locating user code


def display_path(path: str) -> str:
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


def toolchain_frame(exc: BaseException) -> SourceLine | None:
    """The exporter's own frame where ``exc`` was raised, when the innermost frame that is
    neither torch nor Python's is ours (not the model's): a gap in the exporter."""
    for e in reversed(list(exception_chain(exc))):  # the root cause first
        for fs in reversed(traceback.extract_tb(e.__traceback__)):  # innermost first
            if _is_framework(fs.filename) or fs.filename.startswith("<") or (
                    fs.filename.startswith(_STDLIB_DIR) and not _is_site_packages(fs.filename)):
                continue
            if fs.filename.startswith(_TOOLCHAIN_DIRS) and fs.filename != _ZOO_FILE:
                return _source_line(fs.filename, fs.lineno, fs.name)
            return None
    return None


_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)(?:, in (\w+))?')
_SHORT_LOC = re.compile(r"\(([^()\s]+\.py):(\d+) in (\w+)\)")


def location_in_message(message: str, origin_file: str | None) -> SourceLine | None:
    """torch puts user locations in messages: full 'File "x", line N' or a short '(x.py:N in f)'."""
    full = _last_model_frame(message)
    if full:
        return full
    for short, line, func in reversed(_SHORT_LOC.findall(message)):
        # the short form is truncated ("mp/exp/model.py"): only trust it when it is the origin
        if origin_file and origin_file.endswith(short):
            return _source_line(origin_file, int(line), func)
    return None


def guard_locations(exc: BaseException) -> list[tuple[SourceLine, str]]:
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


def graph_location(exc: BaseException) -> SourceLine | None:
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



def source_line(node: Node) -> str | None:
    """The innermost frame of the node's stack trace in the model's own code (the line
    calling ``self.linear(x)``, not torch's linear.py), else the innermost frame."""
    trace = node.meta.get("stack_trace") or ""
    matches = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', trace)
    if not matches:
        return None
    path, line, func = ([m for m in matches if is_model_code(m[0])] or matches)[-1]
    return f"{path}:{line} in {func}"


def installed_package(file: str) -> str | None:
    """The installed package a file is in (``transformers``); None: the user's own code."""
    return file.split(f"-packages{os.sep}", 1)[1].split(os.sep)[0] if _is_site_packages(
        file) else None
