"""Ctrl-C and SIGTERM as an interruption (exit 130), remembered as well as raised.

Remembered because the KeyboardInterrupt can be lost on its way up: one that lands in an
import, inside an extension's initialisation, can come back as an ImportError that a
library takes for a missing optional package and passes over; the half-imported module
then fails later in its own way (CI: numpy's ``__getattr__`` recursing, reported as an
internal error, exit 4, instead of 130). And one raised inside an extension's own
initialisation can abort the process (CI: torch's import ended by SIGABRT): so while an
import is under way the KeyboardInterrupt waits until it is done. Imports only contextlib, os and signal,
so the console script can install it before anything heavy loads.
"""

from __future__ import annotations

import contextlib
import os
import signal

_signals: list[int] = []
_told: list[bool] = []  # whether the command has said so (typer turns a Ctrl-C that lands
# outside the command's guard, while click parses the flags, into a silent exit 130)


_pending: list = []  # waiting for an import to end: SIGALRM's handler before
RETRY_S = 0.05
IMPATIENT = 3  # the third signal during one import raises at once (a hung import)


def interrupt(signum, frame) -> None:
    """The signal handler: remember, then raise as Ctrl-C does (once no import runs)."""
    note(signum)
    raise_when_safe(frame)


def raise_when_safe(frame) -> None:
    """Raise KeyboardInterrupt now, or, inside an import or a finalizer, as soon as it is
    done (SIGALRM polls every RETRY_S)."""
    if (_importing(frame) or _finalizing(frame)) and len(_signals) < IMPATIENT:
        previous = signal.signal(signal.SIGALRM, _retry)
        # restart the system calls it lands in: a retry every 50 ms through torch's C++
        # start-up must not hand its reads and waits an EINTR they may not expect
        signal.siginterrupt(signal.SIGALRM, False)
        if not _pending:  # the handler to give SIGALRM back (the model's code may use it)
            _pending[:] = [signal.SIG_DFL if previous is None else previous]
        signal.setitimer(signal.ITIMER_REAL, RETRY_S)
        return
    disarm()
    raise KeyboardInterrupt


def _retry(signum, frame) -> None:
    if _pending:
        raise_when_safe(frame)


def disarm() -> None:
    """Whoever raises the interruption first: no waiting one comes after it. The handler
    to restore is taken first, so a retry that fires while this runs finds nothing to do
    (CI: one raised a second KeyboardInterrupt inside main's except, a traceback)."""
    if _pending:
        previous = _pending.pop()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def _finalizing(frame) -> bool:
    """Inside a ``__del__``: Python prints an exception raised there with its traceback
    and goes on (CI: a Ctrl-C's retry landed in a ZipFile's finalizer)."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


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


def checkpoint() -> None:
    """Where a command may stop cleanly (a stage's start): an interruption raised where
    Python only prints it (a weakref callback, a __del__) and goes on stops it here,
    before the next stage writes anything."""
    if _signals and not _told:
        disarm()
        raise KeyboardInterrupt


@contextlib.contextmanager
def held():
    """Ctrl-C and SIGTERM wait while a block that must not be cut half-way runs (CI: one
    cut a logging handler in its __init__, and logging's exit hook then failed); a signal
    that came is noted on the way out, for the guard to raise where it cleans up."""
    both = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, both)
    try:
        yield
    finally:
        with contextlib.suppress(KeyboardInterrupt):  # the handlers run as it unblocks
            signal.pthread_sigmask(signal.SIG_UNBLOCK, both)


def settle() -> None:
    """At a command's end: once it has told the user, the next command in this process
    (tests run several) starts afresh; an untold one stays for main() to report."""
    if _told:
        forget()


def forget() -> None:
    disarm()
    _signals.clear()
    _told.clear()


def terminated(signum, frame) -> None:
    """A command's SIGTERM handler (a CI timeout, ``kill``): handled as Ctrl-C is, with
    compilers and other child processes stopped first; exit 130."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: cleanup must not be cut short
    note(signum)
    for pid in _descendants(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    raise_when_safe(frame)


def _descendants(pid: int) -> list[int]:
    """Child processes, recursively, from /proc (Linux; elsewhere none are found). Read
    here rather than with psutil: ten lines, and the core needs no extra package."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{entry.name}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found
