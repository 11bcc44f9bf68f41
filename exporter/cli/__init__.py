"""``exporter``: the command line. It only parses flags and calls the Python API.

One module per group of commands, all on one typer app (``common.app``); the output
style, exit codes and ``--json`` envelope every command shares are in ``common``.
"""

import atexit
import contextlib
import gc
import os
import signal
import sys

from exporter.cli.interrupts import interrupt as _interrupt
from exporter.cli.interrupts import disarm, interrupted, untold


def main() -> None:
    # SIGTERM while torch imports (seconds, more on a loaded machine) as Ctrl-C then: exit
    # 130 with a word, not a death by signal; each command installs its own handler after.
    # Ctrl-C through the same handler, which also remembers it (exporter/cli/interrupts.py).
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    if sys.argv[1:] == ["--version"]:  # answered before typer and the commands import
        print(version_line())
        return
    # torch.export and FX make millions of short-lived objects: the cyclic GC's young
    # passes took 1.8 of a 14.3 CPU s onnx build (0.5 with these); what the imports made is
    # frozen out of every pass. gc.collect() still frees everything (docs/testing.md).
    gc.set_threshold(50_000, 20, 10)
    try:  # typer and the named command's module import here: a while on a loaded machine
        # (CI: a Ctrl-C 3 s in landed there); --help lists commands without importing them
        from exporter.cli.commands import console_command
        command = console_command(sys.argv[1:])
        gc.freeze()
        if interrupted():  # raised, and swallowed on its way up; or still waiting
            disarm()  # for an import to end: raised here instead, once
            raise KeyboardInterrupt
    except KeyboardInterrupt:  # Ctrl-C before any command ran: nothing to clean up
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second one must not cut this short
        disarm()
        print("interrupted: nothing was written", file=sys.stderr, flush=True)
        # Not SystemExit: a half-imported torch can turn the interpreter's shutdown into a
        # death by SIGINT (exit -2, seen when the signal landed ~1 s in); nothing is open.
        os._exit(130)
    try:
        command()
    except SystemExit as done:
        # 130: interrupted, and the command has cleaned up, or the signal came while click
        # parsed the flags, before the command's guard: typer exits 130 then, silently.
        if done.code != 130 and not interrupted():
            raise
        if untold():
            print("interrupted", file=sys.stderr, flush=True)
        # A KeyboardInterrupt that landed inside an extension's initialisation can leave
        # the interpreter ending by a signal of its own (exit -2, seen under load in CI's
        # SIGTERM test) instead of the code the command chose: the exit handlers run, then
        # the process ends here.
        _close_logging_handlers()
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(130)


def _close_logging_handlers() -> None:
    """logging's exit hook, one handler at a time: one the interruption cut in its
    __init__ has no stream or lock, and logging's own hook stopped at it with a
    traceback (CI), leaving the handlers after it unflushed."""
    import logging
    atexit.unregister(logging.shutdown)
    for handler_ref in reversed(logging._handlerList[:]):
        with contextlib.suppress(Exception):
            logging.shutdown([handler_ref])


def version_line() -> str:
    """``exporter 0.1.0 (torch 2.13.0+cpu)``: versions from the packages' metadata, since
    importing torch to ask takes seconds."""
    import importlib.metadata
    from exporter.versions import toolchain_version
    try:
        torch = f"torch {importlib.metadata.version('torch')}"
    except importlib.metadata.PackageNotFoundError:
        torch = "torch not installed"
    return f"exporter {toolchain_version()} ({torch})"


def _registered_app():
    """The typer app with every command on it (the console script imports each command's
    module only when it is named: exporter/cli/commands.py)."""
    import importlib

    from exporter.cli.commands import COMMANDS
    from exporter.cli.common import app
    for module, _ in COMMANDS.values():
        importlib.import_module(module)
    return app


def __getattr__(name: str):
    """``from exporter.cli import app`` (tests, tools that embed the CLI): imported on first
    use, so the console script can catch a Ctrl-C that lands while torch imports."""
    if name == "app":
        return _registered_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
