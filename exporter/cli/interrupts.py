"""Ctrl-C and SIGTERM as an interruption (exit 130), remembered as well as raised.

Remembered because the KeyboardInterrupt can be lost on its way up: one that lands in an
import, inside an extension's initialisation, can come back as an ImportError that a
library takes for a missing optional package and passes over; the half-imported module
then fails later in its own way (CI: numpy's ``__getattr__`` recursing, reported as an
internal error, exit 4, instead of 130). Imports nothing, so the console script can
install it before anything heavy loads.
"""

from __future__ import annotations

_signals: list[int] = []
_told: list[bool] = []  # whether the command has said so (typer turns a Ctrl-C that lands
# outside the command's guard, while click parses the flags, into a silent exit 130)


def interrupt(signum, frame) -> None:
    """The signal handler: remember, then raise as Ctrl-C does."""
    note(signum)
    raise KeyboardInterrupt


def note(signum: int) -> None:
    _signals.append(signum)


def interrupted() -> bool:
    """Whether a signal raised KeyboardInterrupt in this process since ``forget()``."""
    return bool(_signals)


def told() -> None:
    """The command has told the user it was interrupted, and what that left."""
    _told.append(True)


def untold() -> bool:
    """Interrupted, and nobody said so yet."""
    return interrupted() and not _told


def forget() -> None:
    _signals.clear()
    _told.clear()
