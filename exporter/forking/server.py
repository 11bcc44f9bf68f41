"""The fork server: ``python -m exporter.forking.server OPTIONS MODULE...`` imports the
modules once, then forks one fresh child per request (exporter/forking/client.py is the
client). A child is what ``python -m MODULE ARGS`` would be: its own process, arguments,
environment, working folder, stdout and stderr files, exit code or signal; only the
imports are done already.

Protocol, one JSON object a line: the client writes a request (``argv``, ``env``, ``cwd``,
``stdout``, ``stderr``) on stdin; the server answers ``{"pid": N, "cold": WHY}``, then
``{"exit": CODE}`` (``-SIGNAL`` for a signal) when the child ends. ``{"kill": true}`` on
stdin kills the running child. End of stdin (the client is gone) kills it and exits.

OPTIONS, a JSON object: ``session`` (each child in a session of its own, killed as a
whole: a build's compilers with it; else it stays in the client's process group, so the
terminal's Ctrl-C reaches it), ``parent`` (a pid: die with it, Linux's parent-death
signal), ``gpu`` and ``threads`` (exporter/forking/preload.py). Where forking is unsafe,
each child executes a fresh interpreter instead (same protocol, same result). Imports only
the standard library at module level: what it preloads is chosen by the client.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import sys

from exporter.forking import preload
from exporter.forking.child import become, die_with


def main(options: dict, modules: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C is its client's
    if options.get("parent"):
        die_with(options["parent"])
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # the protocol's pipe is not for anything an import prints
    start_dir = os.getcwd()
    import ctypes  # noqa: F401  each child asks prctl for its parent-death signal
    cold = preload.preload(modules, options.get("gpu", True), options.get("threads", False))
    # the imports' objects live as long as the server: out of every child's full GC pass
    # (90 ms each with torch and the runtime), and their pages stay shared after a fork
    gc.freeze()
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    session = bool(options.get("session"))
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
            become(request, os.getppid(), cold, start_dir, session)  # never returns
        _reply(replies, {"pid": pid, "cold": cold})
        code, buffer, gone = _wait(pid, session, requests, buffer)
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


def _wait(pid: int, session: bool, requests, buffer: bytes) -> tuple[int, bytes, bool]:
    """Wait for the child, killing it when asked (in ``buffer`` already, or later) or
    when the client is gone: (its exit code, unread input, whether the client is gone)."""
    done = os.pidfd_open(pid)
    gone, buffer = False, _kills_taken(pid, session, buffer)
    try:
        while done not in select.select([done] + ([] if gone else [requests]), [], [])[0]:
            chunk = requests.read(65536)
            buffer = _kills_taken(pid, session, buffer + chunk)
            if not chunk:
                gone = True
                _kill(pid, session)
    finally:
        os.close(done)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), buffer, gone


def _kills_taken(pid: int, session: bool, buffer: bytes) -> bytes:
    """``buffer`` less its kill requests, the child killed if there was one."""
    *lines, rest = buffer.split(b"\n")
    kept = [line for line in lines if b'"kill"' not in line]
    if len(kept) < len(lines):
        _kill(pid, session)
    return b"".join(line + b"\n" for line in kept) + rest


def _kill(pid: int, session: bool) -> None:
    """SIGKILL the child, and its whole session where it has one (compilers it started)."""
    if session:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):  # before its setsid, or in no session
        os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2:])
    os._exit(0)  # an interpreter with torch loaded takes a second to tear down
