"""Warm workers: each cell's ``exporter`` process forked from one that imported torch,
transformers, the builder and the targets' compilers once, instead of a fresh interpreter
that imports them again for every cell.

A fresh ``python -m exporter build`` spends 5-9 s importing before it reads its model (2
cores: torch 2.6 s, transformers 2.6 s, Inductor 3.2 s, TVM 1.6 s); a small onnx cell
took 16 s cold and 9 s forked. A cell is still its own process, in its own session, with
its own time limit, stdout and exit code, as ``python -m exporter`` gives them.

One warm process per worker (a pool thread, or a Ray worker process), keyed by what it
was started with: the cell's environment is read at import (OpenMP's threads, Inductor's
compile workers), so a cell whose environment differs gets another warm process. It
serves one cell at a time and dies with whoever started it (Linux's parent-death
signal), and each cell dies with it, so a Ray worker killed mid-build takes its build
along, as a cold cell does.

Why not ``multiprocessing``'s forkserver: its preload list and environment are fixed for
the whole process at its first start (a long-lived process running matrices with other
thread counts would reuse a stale one), and it cannot hand a child's stdout and exit code
over as a subprocess does. Linux only: forking a process that imported torch is unsafe on
macOS, where cells run cold.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from exporter.matrix import fork_safe
from runtime.host import scratch

# what every cell imports before it reads its model (the CLI's own modules add 0.2 s);
# a target adds its compilers (Target.packaging.build_modules)
BASE_MODULES = ("torch", "torch.export", "transformers", "transformers.modeling_utils",
                "exporter.builder.pipeline")
AVAILABLE = sys.platform.startswith("linux")
_PR_SET_PDEATHSIG = 1


class WarmProcessDied(RuntimeError):
    """The warm process ended while a cell ran (the cell's record says so: a crash)."""


class WarmProcess:
    """The client side: one warm process, one cell at a time."""

    def __init__(self, env: dict[str, str], modules: tuple[str, ...], gpu: bool = True
                 ) -> None:
        """``gpu``: whether its cells may use a GPU (exporter/matrix/fork_safe.py)."""
        self._log = scratch.make_file("exporter-warm-", suffix=".log")
        with open(self._log, "wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(os.getpid()), "gpu" if gpu else "cpu",
                 *modules],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
                start_new_session=True)
        self._buffer = b""
        # why its cells start in a fresh interpreter after all (fork_safe.preload)
        self.cold_because: str | None = None

    def run(self, args: list[str], cwd: str, timeout: float, on_start) -> tuple[int, str, str]:
        """``exporter ARGS`` in a forked child: (exit code, stdout, stderr), as
        subprocess.run gives them. ``on_start(pid)`` once the child runs.
        subprocess.TimeoutExpired after ``timeout`` s (the child's session killed first)."""
        out = scratch.make_file("exporter-cell-", suffix=".out")
        err = scratch.make_file("exporter-cell-", suffix=".err")
        try:
            self._send({"args": args, "cwd": cwd, "stdout": str(out), "stderr": str(err)})
            started = self._reply(None)
            pid, self.cold_because = started["pid"], started.get("cold")
            on_start(pid)
            try:
                code = self._reply(time.monotonic() + timeout)["exit"]
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                self._reply(None)  # the child reaped
                raise
            return code, out.read_text(errors="replace"), err.read_text(errors="replace")
        finally:
            scratch.remove(out)
            scratch.remove(err)

    def alive(self) -> bool:
        return self._proc.poll() is None

    def close(self) -> None:
        """Killed, not asked to exit: between cells it holds nothing but imports, and an
        interpreter with torch loaded takes seconds to tear down."""
        self._proc.kill()
        self._proc.wait()
        for pipe in (self._proc.stdin, self._proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()
        scratch.remove(self._log)

    def _send(self, request: dict) -> None:
        try:
            self._proc.stdin.write(json.dumps(request).encode() + b"\n")
            self._proc.stdin.flush()
        except OSError:
            raise WarmProcessDied(self._death()) from None

    def _reply(self, deadline: float | None) -> dict:
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and (wait <= 0 or not select.select([fd], [], [], wait)[0]):
                raise subprocess.TimeoutExpired("exporter (warm)", 0)
            chunk = os.read(fd, 65536)
            if not chunk:
                raise WarmProcessDied(self._death())
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def _death(self) -> str:
        code = self._proc.wait()
        tail = (Path(self._log).read_text(errors="replace").strip().splitlines()
                or ["(nothing on stderr)"])[-1][:300]
        return f"the warm worker process ended (exit {code}); its stderr ends: {tail}"


_OWN = threading.local()  # this thread's warm processes, by what they were started with
_ALL: list[WarmProcess] = []
_LOCK = threading.Lock()


def process_for(env: dict[str, str], modules: tuple[str, ...], gpu: bool = True
                ) -> WarmProcess:
    """This thread's warm process for ``env``, ``modules`` and ``gpu`` (started, or
    restarted after it died)."""
    mine = _OWN.__dict__.setdefault("processes", {})
    key = (json.dumps(env, sort_keys=True), modules, gpu)
    warm = mine.get(key)
    if warm is None or not warm.alive():
        warm = mine[key] = WarmProcess(env, modules, gpu)
        with _LOCK:
            _ALL.append(warm)
    return warm


def close_all() -> None:
    """End every warm process this process started (at the end of a matrix)."""
    with _LOCK:
        done, _ALL[:] = list(_ALL), []
    for warm in done:
        warm.close()
    _OWN.__dict__.pop("processes", None)


# --- the warm process itself: python -m exporter.matrix.warm PARENT_PID MODULE... ---

def _serve(parent: int, gpu: bool, modules: list[str]) -> None:
    _die_with_parent(parent)
    server = os.getpid()
    replies = os.fdopen(os.dup(1), "wb", buffering=0)  # the protocol's; stdout goes to stderr
    os.dup2(2, 1)
    cold_because = fork_safe.preload(modules, gpu)  # None: cells fork from here
    for line in sys.stdin.buffer:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            replies.close()
            _child(request, server, cold=cold_because is not None)  # never returns
        replies.write(json.dumps({"pid": pid, "cold": cold_because}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")


def _child(request: dict, parent: int, cold: bool) -> None:
    """Become ``python -m exporter ARGS``: own session, own files, the CLI's exit code.
    ``cold``: this process cannot be forked safely, so the child execs a fresh
    interpreter (same pid, session, files and parent-death signal)."""
    code = 1
    try:
        os.setsid()  # the client kills the cell's session on timeout: compilers included
        _die_with_parent(parent)
        _own_exit_handlers()
        os.chdir(request["cwd"])
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                                (1, request["stdout"], os.O_WRONLY | os.O_TRUNC),
                                (2, request["stderr"], os.O_WRONLY | os.O_TRUNC)):
            opened = os.open(path, flags)
            os.dup2(opened, fd)
            os.close(opened)
        if cold:
            os.execv(sys.executable, [sys.executable, "-m", "exporter", *request["args"]])
        sys.argv = ["exporter", *request["args"]]
        runpy.run_module("exporter", run_name="__main__")  # as `python -m exporter` does
        code = 0
    except SystemExit as done:
        code = _exit_code(done.code)
    except BaseException:  # noqa: BLE001  as the interpreter would: traceback, exit 1
        import traceback
        traceback.print_exc()
    finally:
        atexit._run_exitfuncs()  # the cell's own exit handlers (_own_exit_handlers)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _own_exit_handlers() -> None:
    """Drop the exit handlers the warm process's imports registered: they tidy its
    resources (pools, caches, temporary files made at import), which later cells forked
    from it still use; a cell that ran them at its end could take them from the next.
    Keep the two that are about this process: its logging handlers and its scratch log."""
    atexit._clear()
    atexit.register(logging.shutdown)
    atexit.register(scratch.forget_own_log)


def _exit_code(code) -> int:
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def _die_with_parent(parent: int) -> None:
    """SIGKILL when ``parent`` ends (exit now if it already has)."""
    import ctypes
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(137)


if __name__ == "__main__":
    _serve(int(sys.argv[1]), sys.argv[2] == "gpu", sys.argv[3:])
