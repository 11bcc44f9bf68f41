"""Ctrl-C and SIGTERM as an interruption: exit 130 with one line, whatever a library did
with the KeyboardInterrupt and wherever in start-up it landed (exporter/cli/interrupts.py).
The end-to-end signal tests are in tests/system/test_reliability.py."""

from __future__ import annotations

import signal
import sys

import pytest
import typer

from exporter.cli import interrupts
from exporter.cli.common import guarded


def _exit_code(action) -> int:
    """The exit code guarded() gives a command body (it always exits through typer.Exit)."""
    with pytest.raises(typer.Exit) as caught:
        guarded(action)
    return caught.value.exit_code


def test_an_interruption_a_library_wrapped_is_still_an_interruption(capsys):
    """SIGTERM (as Ctrl-C) while onnxruntime's pybind11 module initialised came back as
    "ImportError: initialization failed" raised from it, and the build reported an
    internal error (exit 4) where an interrupted one exits 130. A plain error stays ours."""
    def interrupted_import():
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise ImportError("initialization failed") from exc

    def broken():
        raise ImportError("initialization failed")
    assert _exit_code(interrupted_import) == 130 and "interrupted" in capsys.readouterr().err
    assert _exit_code(broken) == 4


def test_an_interruption_a_library_swallowed_is_still_an_interruption(capsys):
    """CI: a Ctrl-C that landed in an import inside an extension's initialisation came back
    as an ImportError that a library passed over; the half-imported module then failed in
    its own way (numpy's __getattr__ recursing, exit 4). The signal handler remembers the
    signal, so the error that follows is the interruption (130); the next command in the
    same process starts afresh."""
    def swallowed_then_broken():
        try:
            interrupts.interrupt(signal.SIGINT, None)
        except KeyboardInterrupt:
            pass  # what the library did with it
        raise RecursionError("maximum recursion depth exceeded")

    def plain_error():
        raise RecursionError("a bug of ours")
    try:
        assert _exit_code(swallowed_then_broken) == 130
        assert "interrupted" in capsys.readouterr().err
        assert _exit_code(plain_error) == 4
    finally:
        interrupts.forget()


def test_a_ctrl_c_noted_before_the_guard_interrupts_the_command(capsys):
    """CI: a Ctrl-C that landed in an import after main()'s check, its raise still waiting
    for the import to end, was cancelled when the command's guard started: the build then
    ran to the end (exit 0). The guard raises it, and the next command starts afresh."""
    ran = []
    try:
        interrupts.note(signal.SIGINT)
        assert _exit_code(lambda: ran.append("build") or 0) == 130 and ran == []
        assert "interrupted" in capsys.readouterr().err
        assert _exit_code(lambda: ran.append("next") or 0) == 0 and ran == ["next"]
    finally:
        interrupts.forget()


def test_a_waiting_retry_that_fires_while_disarmed_raises_nothing(monkeypatch):
    """CI: the SIGALRM retry fired inside disarm(), between main() raising the interruption
    and cancelling the timer: a second KeyboardInterrupt escaped main's except (a
    traceback, death by SIGINT). The alarm is simulated arriving as the timer is cancelled."""
    def alarm_arrives(*args):
        interrupts._retry(signal.SIGALRM, None)
    previous = signal.getsignal(signal.SIGALRM)
    try:
        interrupts.note(signal.SIGINT)
        interrupts._pending[:] = [previous]
        monkeypatch.setattr(interrupts.signal, "setitimer", alarm_arrives)
        interrupts.disarm()  # raises nothing
        assert interrupts._pending == [] and signal.getsignal(signal.SIGALRM) == previous
    finally:
        monkeypatch.undo()
        interrupts.forget()


def test_a_ctrl_c_during_the_guards_set_up_waits_and_then_interrupts(capsys):
    """CI: a Ctrl-C cut a logging handler in its __init__ while the guard set logging up;
    logging's exit hook then failed with a traceback. The set-up runs with the signals
    held; the one that came is raised before the command's body runs."""
    previous = signal.signal(signal.SIGINT, interrupts.interrupt)
    ran = []
    try:
        with interrupts.held():
            signal.raise_signal(signal.SIGINT)
            ran.append("set-up finished")
        assert ran == ["set-up finished"] and interrupts.interrupted()
        assert _exit_code(lambda: ran.append("body") or 0) == 130 and ran == ["set-up finished"]
        assert "interrupted" in capsys.readouterr().err
    finally:
        signal.signal(signal.SIGINT, previous)
        interrupts.forget()


def test_an_interruption_python_only_printed_stops_the_next_stage(capsys):
    """CI: the interruption was raised inside a weakref callback, where Python prints it
    and goes on; the build ran to the end and wrote its artifact. The next stage's start
    raises it, so nothing after it runs."""
    from exporter.cli.common import stage_printer
    stage, done = stage_printer(), []

    def build():
        with stage("validate"):
            interrupts.note(signal.SIGINT)  # raised and printed-and-ignored by Python
            done.append("validate")
        with stage("package"):
            done.append("package")
    try:
        assert _exit_code(build) == 130 and done == ["validate"]
        assert "interrupted" in capsys.readouterr().err
    finally:
        interrupts.forget()


def test_the_exit_after_an_interruption_closes_logging_past_a_half_built_handler(
        capsys, monkeypatch):
    """CI: a Ctrl-C cut a StreamHandler in its __init__ (no stream, no lock yet); at exit
    logging's hook stopped at it with "Exception ignored ... AttributeError" and a
    traceback. The interrupted exit closes the handlers one at a time, quietly."""
    import atexit
    import io
    import logging

    from exporter.cli import _close_logging_handlers

    class Written(io.StringIO):
        flushed = False

        def flush(self):
            Written.flushed = True
    monkeypatch.setattr(logging, "_handlerList", [])  # pytest's own handlers stay open
    whole = logging.StreamHandler(Written())
    half_built = object.__new__(logging.StreamHandler)
    logging._addHandlerRef(half_built)  # what Handler.__init__ does before the cut
    try:
        _close_logging_handlers()
        assert Written.flushed and "Traceback" not in capsys.readouterr().err
    finally:
        atexit.register(logging.shutdown)
        whole.close()


class _Finalized:
    def __init__(self, raised: list):
        self.raised = raised

    def __del__(self):
        try:
            interrupts.raise_when_safe(sys._getframe())
        except KeyboardInterrupt:
            self.raised.append(True)


def test_an_interruption_in_a_finalizer_waits_for_it_and_one_elsewhere_does_not():
    """CI: a Ctrl-C's retry landed in a ZipFile's __del__, where Python prints the
    exception with its traceback and goes on: there it waits like one inside an import."""
    raised = []
    interrupts.note(signal.SIGINT)
    try:
        _Finalized(raised)  # dropped at once: its __del__ runs here
        assert raised == [] and interrupts._pending  # the retry alarm is set instead
        with pytest.raises(KeyboardInterrupt):
            interrupts.raise_when_safe(sys._getframe())
        assert not interrupts._pending  # raised, so nothing waits any more
    finally:
        interrupts.forget()
