"""The validation processes' template: ``python -m exporter.validation.template MODULE...``
imports torch and the runtime once, then forks one fresh child per validation
(exporter/validation/process.py is the client). A child is what ``python -m MODULE ARGS``
would be: its own process, arguments, environment, working folder, stdout and stderr
files, exit code or signal; only the imports are done already.

Protocol, one JSON object a line: the client writes a request (``argv``, ``env``, ``cwd``,
``stdout``, ``stderr``) on stdin; the template answers ``{"pid": N}``, then
``{"exit": CODE}`` (``-SIGNAL`` for a signal) when the child ends. ``{"kill": true}`` on
stdin kills the running child. End of stdin (the client is gone) kills it and exits.

Forking is safe only before OpenMP (or any other pool) started threads and before CUDA
was initialized: the template checks both after its imports, and where either happened
each child executes a fresh interpreter instead (same protocol, same result). Imports
only the standard library at module level: what it preloads is chosen by the client.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import select
import signal
import sys
import traceback

_PR_SET_PDEATHSIG = 1
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"  # counting GPUs this way keeps forks usable


def main(modules: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C is its client's
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the protocol's pipe is not for anything an import prints
    start_dir = os.getcwd()
    import ctypes  # noqa: F401  each child asks prctl for its parent-death signal
    cold = _preload(modules)
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    buffer = b""
    while True:
        line, buffer = _line(requests, buffer)
        if line is None:
            return
        request = json.loads(line)
        if "argv" not in request:
            continue  # a kill for a child that has ended already
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            requests.close()
            replies.close()
            _child(request, os.getppid(), cold, start_dir)  # never returns
        _reply(replies, {"pid": pid})
        code, buffer, gone = _wait(pid, requests, buffer)
        _reply(replies, {"exit": code})
        if gone:
            return


def _reply(replies, message: dict) -> None:
    with contextlib.suppress(BrokenPipeError):  # the client is gone: _wait sees it too
        replies.write(json.dumps(message).encode() + b"\n")


def _line(stream, buffer: bytes) -> tuple[bytes | None, bytes]:
    while b"\n" not in buffer:
        chunk = stream.read(65536)
        if not chunk:
            return None, buffer
        buffer += chunk
    line, _, rest = buffer.partition(b"\n")
    return line, rest


def _wait(pid: int, requests, buffer: bytes) -> tuple[int, bytes, bool]:
    """Wait for the child, killing it when asked (in ``buffer`` already, or later) or
    when the client is gone: (its exit code, unread input, whether the client is gone)."""
    done = os.pidfd_open(pid)
    gone, buffer = False, _kills_taken(pid, buffer)
    try:
        while done not in select.select([done] + ([] if gone else [requests]), [], [])[0]:
            chunk = requests.read(65536)
            buffer = _kills_taken(pid, buffer + chunk)
            if not chunk:
                gone = True
                _kill(pid)
    finally:
        os.close(done)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), buffer, gone


def _kills_taken(pid: int, buffer: bytes) -> bytes:
    """``buffer`` less its kill requests, the child killed if there was one."""
    *lines, rest = buffer.split(b"\n")
    kept = [line for line in lines if b'"kill"' not in line]
    if len(kept) < len(lines):
        _kill(pid)
    return b"".join(line + b"\n" for line in kept) + rest


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _preload(modules: list[str]) -> str | None:
    """Import ``modules``; None when a fork of this process may run a child, else why
    not (then each child executes a fresh interpreter)."""
    threads = _threads()
    before = os.environ.get(NVML_CHECK)
    os.environ[NVML_CHECK] = "1"
    try:
        for name in modules:
            try:
                __import__(name)
            except Exception as exc:  # noqa: BLE001  the child imports it again and reports it
                print(f"template: could not import {name}: {exc!r}", file=sys.stderr)
            if name == "numpy":  # OpenBLAS starts its threads at load (and is fork-safe)
                threads = _threads()
    finally:
        if before is None:
            os.environ.pop(NVML_CHECK, None)
        else:
            os.environ[NVML_CHECK] = before
    if _threads() > threads:
        return "an import started threads (a fork would lose them)"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda._is_compiled() and torch.cuda.is_initialized():
        return "an import initialized CUDA, which a forked process cannot use"
    return None


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _child(request: dict, template: int, cold: str | None, start_dir: str) -> None:
    """Become ``python -m ARGV``: never returns."""
    code = 1
    atexit._clear()  # the template's imports' handlers tidy what later children still use
    try:
        for number in (signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _die_with(template)
        os.chdir(request["cwd"])
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                                (1, request["stdout"], os.O_WRONLY | os.O_TRUNC),
                                (2, request["stderr"], os.O_WRONLY | os.O_TRUNC)):
            opened = os.open(path, flags)
            os.dup2(opened, fd)
            os.close(opened)
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


def _die_with(template: int) -> None:
    """SIGKILL when the template ends (at once if it already has)."""
    import ctypes
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != template:
        os._exit(137)


if __name__ == "__main__":
    main(sys.argv[1:])
    os._exit(0)  # an interpreter with torch loaded takes a second to tear down
