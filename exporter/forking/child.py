"""A fork server's child (exporter/forking/server.py) becoming ``python -m ARGV``: the
request's session or process group, files, folder, environment and exit handlers, then
the module run as the interpreter runs it. Standard library only, like the server."""

from __future__ import annotations

import atexit
import contextlib
import os
import runpy
import signal
import sys
import traceback

_PR_SET_PDEATHSIG = 1


def become(request: dict, server: int, cold: str | None, start_dir: str,
           session: bool) -> None:
    """Become ``python -m ARGV``: never returns. ``cold``: the server cannot be forked
    safely, so this execs a fresh interpreter (same pid, files and parent-death signal)."""
    code = 1
    _own_exit_handlers()
    try:
        if session:
            os.setsid()  # the whole session is killed on timeout: compilers included
        for number in (signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        die_with(server)
        os.chdir(request["cwd"])
        _redirect(request)
        os.environ.clear()
        os.environ.update(request["env"])
        if cold:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execve(sys.executable, [sys.executable, "-m", *request["argv"]],
                      dict(os.environ))
        code = _run(request["argv"], request["cwd"], start_dir)
    except BaseException:  # noqa: BLE001  as the interpreter would: a traceback, exit 1
        traceback.print_exc()
    finally:
        _exit(code)


def _redirect(request: dict) -> None:
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                            (1, request["stdout"], os.O_WRONLY | os.O_TRUNC),
                            (2, request["stderr"], os.O_WRONLY | os.O_TRUNC)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)


def _own_exit_handlers() -> None:
    """Drop the exit handlers the server's imports registered: they tidy its resources
    (pools, caches, temporary files made at import), which later children still use.
    Keep those about this process that a fresh interpreter's imports would register:
    logging's flush, and the scratch registry's record of this process's files."""
    atexit._clear()
    if "logging" in sys.modules:
        atexit.register(sys.modules["logging"].shutdown)
    scratch = sys.modules.get("runtime.host.scratch")
    if scratch is not None:
        atexit.register(scratch.forget_own_log)


def _run(argv: list[str], cwd: str, start_dir: str) -> int:
    """``python -m argv[0] argv[1:]`` in this process, as the interpreter runs it."""
    import faulthandler
    if os.environ.get("PYTHONFAULTHANDLER"):
        faulthandler.enable(file=sys.stderr)
    else:
        faulthandler.disable()
    if sys.path and sys.path[0] == start_dir:  # `python -m` puts the working folder first
        sys.path[0] = cwd
    sys.argv = ["-m", *argv[1:]]
    # `python -m` runs a module not yet imported: one the template preloaded for its imports
    # leaves sys.modules (runpy warned "found in sys.modules ... prior to execution")
    for name in (argv[0], f"{argv[0]}.__main__"):
        if not hasattr(sys.modules.get(name), "__path__"):
            sys.modules.pop(name, None)
    try:
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    except SystemExit as done:
        return _exit_code(done.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        atexit._run_exitfuncs()
        _flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # dies by SIGINT, as Python does
        os.kill(os.getpid(), signal.SIGINT)
    return 0


def _exit(code: int) -> None:
    atexit._run_exitfuncs()
    _flush()
    os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _exit_code(code) -> int:
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def die_with(parent: int) -> None:
    """SIGKILL when ``parent`` ends (at once if it already has)."""
    import ctypes
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(137)
