"""The client side of a fork server (exporter/forking/server.py): starting one, asking it
for a child and reading the child's pid and exit code, and the pools of them a process
keeps (the matrix's warm workers, one per pool thread; the validation's templates).

A server is started with its children's environment: imports read it (OpenMP's threads,
Inductor's compile workers, CUDA), so a job whose environment differs gets another
server. Why not ``multiprocessing``'s forkserver: its preload list and environment are
fixed for the whole process at its first start, and it cannot hand a child's stdout and
exit code over as a subprocess does. Linux only: forking a process that imported torch
is unsafe on macOS, where jobs start a fresh interpreter.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

from runtime.host import scratch

AVAILABLE = sys.platform.startswith("linux") and hasattr(os, "pidfd_open")
# pytest rewrites it before every test; no import reads it
VOLATILE = frozenset({"PYTEST_CURRENT_TEST"})


class ServerGone(RuntimeError):
    """The fork server ended (before its child did, or before it forked one)."""


def env_key(env: dict[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if k not in VOLATILE))


class ForkServer:
    """One fork server, one child at a time. ``name`` says it in messages; ``session``,
    ``gpu``, ``threads``: server.py's options; ``die_with_parent``: it dies with this
    process's starting thread (a pool thread that lives as long as its servers)."""

    def __init__(self, env: dict[str, str], modules: tuple[str, ...], *, name: str,
                 session: bool = False, gpu: bool = True, threads: bool = False,
                 die_with_parent: bool = False) -> None:
        self.name, self.owner, self.busy = name, os.getpid(), False
        self.key: tuple = ()  # set by the pool that keeps it
        self.cold_because: str | None = None  # why its children start fresh (preload.py)
        options = {"session": session, "gpu": gpu, "threads": threads,
                   "parent": os.getpid() if die_with_parent else None}
        self._log = scratch.make_file("exporter-forkserver-", suffix=".log")
        with open(self._log, "wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "exporter.forking.server", json.dumps(options),
                 *modules], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                env=env, start_new_session=session)
        self._buffer = b""

    def start(self, argv: list[str], env: dict[str, str], cwd: str, stdout: Path,
              stderr: Path) -> None:
        """Ask for ``python -m ARGV``; its pid comes as the next reply."""
        self.send({"argv": argv, "env": env, "cwd": cwd, "stdout": str(stdout),
                   "stderr": str(stderr)})

    def kill(self) -> None:
        """SIGKILL the running child (its session too, where it has one)."""
        with contextlib.suppress(ServerGone):
            self.send({"kill": True})

    def alive(self) -> bool:
        return self._proc.poll() is None

    def send(self, message: dict) -> None:
        try:
            self._proc.stdin.write(json.dumps(message).encode() + b"\n")
            self._proc.stdin.flush()
        except (OSError, ValueError):
            raise ServerGone(self._death()) from None

    def reply(self, deadline: float | None) -> dict:
        """The next message; subprocess.TimeoutExpired past ``deadline``, ServerGone at
        its end."""
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], wait)[0]:
                raise subprocess.TimeoutExpired(self.name, wait or 0)
            chunk = os.read(fd, 65536)
            if not chunk:
                raise ServerGone(self._death())
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        message = json.loads(line)
        if "pid" in message:
            self.cold_because = message.get("cold")
        return message

    def close(self) -> None:
        """Killed, not asked to exit: between children it holds nothing but imports, and
        an interpreter with torch loaded takes seconds to tear down."""
        with contextlib.suppress(OSError):
            self._proc.kill()
        self._proc.wait()
        for pipe in (self._proc.stdin, self._proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()
        scratch.remove(self._log)

    def _death(self) -> str:
        code = self._proc.wait()
        with contextlib.suppress(OSError):
            lines = Path(self._log).read_text(errors="replace").strip().splitlines()
            tail = (lines or ["(nothing on stderr)"])[-1][:300]
            return f"the {self.name} process ended (exit {code}); its stderr ends: {tail}"
        return f"the {self.name} process ended (exit {code})"


class Pool:
    """The fork servers this process keeps, by what they were started with. ``make``
    starts one; ``per_thread``: each thread has its own (the matrix's pool threads);
    ``kept``: how many idle ones stay (None: all, until close_all)."""

    def __init__(self, make, per_thread: bool = False, kept: int | None = None) -> None:
        self._make, self._per_thread, self._kept = make, per_thread, kept
        self._servers: list[ForkServer] = []
        self._lock = threading.Lock()
        _POOLS.append(self)

    def get(self, env: dict[str, str], modules: tuple[str, ...], **options) -> ForkServer:
        """The server for these (started, or restarted after it died), busy or not."""
        with self._lock:
            return self._find(env, modules, options, busy_ok=True)

    def acquire(self, env: dict[str, str], modules: tuple[str, ...], **options
                ) -> ForkServer | None:
        """An idle server for these (started if none), marked busy; None where the one
        for them is busy already (the caller starts a fresh interpreter instead)."""
        with self._lock:
            server = self._find(env, modules, options, busy_ok=False)
            if server is not None:
                server.busy = True
            return server

    def release(self, server: ForkServer, usable: bool) -> None:
        with self._lock:
            server.busy = False
            if not usable and server in self._servers:
                self._servers.remove(server)
                server.close()

    def servers(self) -> list[ForkServer]:
        with self._lock:
            return list(self._servers)

    def close_all(self) -> None:
        """End the servers this process started (a running child dies with its server)."""
        with self._lock:
            done, self._servers[:] = list(self._servers), []
        for server in done:
            if server.owner == os.getpid():
                server.close()

    def _find(self, env, modules, options, busy_ok: bool) -> ForkServer | None:
        key = (threading.get_ident() if self._per_thread else None, env_key(env),
               tuple(modules), tuple(sorted(options.items())))
        for ended in [s for s in self._servers if not s.alive()]:
            self._servers.remove(ended)
            ended.close()
        same = [s for s in self._servers if s.key == key]
        if same:
            return same[0] if busy_ok or not same[0].busy else None
        server = self._make(env, tuple(modules), **options)
        server.key = key
        self._servers.append(server)
        self._trim(server)
        return server

    def _trim(self, new: ForkServer) -> None:
        if self._kept is None:
            return
        idle = [s for s in self._servers if not s.busy and s is not new]
        for old in idle[:max(0, len(self._servers) - self._kept)]:
            self._servers.remove(old)
            old.close()

    def _forget(self) -> None:
        """A forked process starts its own servers: the inherited ones serve the parent."""
        self._servers.clear()
        self._lock = threading.Lock()


_POOLS: list[Pool] = []


@atexit.register
def _close_pools() -> None:
    for pool in _POOLS:
        pool.close_all()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: [pool._forget() for pool in _POOLS])
