"""Errors a target raises: about its options (bad usage: exit code 2), and one class for
any backend failing on a partition (exit code 3), with one builder that keeps the
backend's full text in a log file and says its first line."""

from __future__ import annotations

import re
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from torch.fx import Node

from runtime.errors import ToolchainError, UserInputError

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # torch.onnx colours its text
MOVES_HINT = "the ops listed are moved to the CPU fallback unless --fallback forbid"


class TargetOptionError(UserInputError):
    """An option the target does not accept, or cannot honour on this machine."""


class LoweringError(ToolchainError):
    """A backend failed on a partition (exit code 3).

    ``nodes`` names the graph nodes it failed on; the build moves them to the CPU
    fallback and lowers again (unless --fallback forbid). A target that cannot tell which
    ops failed leaves it empty and the build moves the whole partition. ``movable`` is
    False where moving ops cannot help (a compiler that hung or crashed, a broken
    toolchain): the build stops and names the log."""

    def __init__(self, *args, nodes: Sequence[str] = (), movable: bool = True,
                 kept: Sequence[Path] = (), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.nodes = list(nodes)
        self.movable = movable
        # logs and reports written for the user: a build that recovers by moving the ops
        # to the fallback removes them (exporter/builder/lowering.py)
        self.kept = list(kept)

    @classmethod
    def from_exception(cls, exc: BaseException, what: str, *, target: str, log_dir: Path,
                       partition: str | None = None, nodes: Sequence[Node] = (),
                       details: list[str] | None = None, where: str | None = None,
                       hint: str | None = None, movable: bool = True,
                       summary: Callable[[str], str] | None = None) -> "LoweringError":
        """``what`` failed because of ``exc``: the full text goes to a log under
        ``log_dir``; the message carries its first line (or ``summary(text)``)."""
        text = _ANSI.sub("", str(exc)).strip()
        first = (summary or first_line)(text)[:300]
        cause = exc.__cause__
        if cause is not None and str(cause).strip():
            first += f" (cause: {type(cause).__name__}: {first_line(str(cause))[:300]})"
        log_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        log_path = log_dir / f"exporter-{target}-{partition or 'compile'}-{stamp}.log"
        # the whole traceback: the message alone was one line ("... is not solvable")
        log_path.write_text("".join(traceback.format_exception(exc)))
        return cls(f"{what} ({type(exc).__name__}: {first})", where=where or str(log_path),
                   details=details if details is not None
                   else [f"{n.name}: {n.target}" for n in nodes],
                   nodes=[n.name for n in nodes], movable=movable, kept=[log_path],
                   hint=hint or (MOVES_HINT if nodes and movable else
                                 f"read the log at {log_path}; --debug shows the traceback"))


def first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0]
