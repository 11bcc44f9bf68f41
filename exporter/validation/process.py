"""The validation process: ``python -m MODULE ARGS`` (the runtime's ``run-cases``,
generation's cases, a cross build's runner under qemu) in a process of its own, forked from
a template that imported torch and the runtime once (exporter/validation/template.py)
instead of a fresh interpreter that imports them again for every build: a torch import is
seconds of CPU, and a test run or a coverage matrix validates hundreds of builds.

The child is what the fresh interpreter was: its own pid, arguments, environment, working
folder, stdout and stderr, exit code or signal, and a crash stays in it. The template is
started on the first validation, with the child's environment: where a later
validation's environment differs, another template is started (imports read it: OpenMP,
CUDA). Where no template can serve (not Linux, one busy in this thread's other
validation, one that died), the child is a fresh interpreter, as before.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

# What every validation child imports before it reads its artifact. Not onnxruntime or
# TVM: their imports start threads, and a fork keeps none of a parent's threads.
PRELOAD = ("numpy", "torch", "safetensors.torch", "runtime", "runtime.__main__",
           "runtime.program.torch_program", "runtime.executors.torch_fallback",
           "runtime.generation")
# pytest rewrites it before every test; no import reads it
VOLATILE = frozenset({"PYTEST_CURRENT_TEST"})
KEPT = 2  # idle templates kept: one environment, and one a test or a matrix cell changed
AVAILABLE = sys.platform.startswith("linux") and hasattr(os, "pidfd_open")


class TemplateGone(RuntimeError):
    """The template ended before it forked the child (it is started afresh)."""


class Template:
    """The client side of one template process: one child at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        self.key, self.owner, self.busy = env_key(env), os.getpid(), False
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "exporter.validation.template", *PRELOAD],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self._buffer = b""

    def alive(self) -> bool:
        return self._proc.poll() is None

    def send(self, message: dict) -> None:
        try:
            self._proc.stdin.write(json.dumps(message).encode() + b"\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise TemplateGone("the template's input is closed") from None

    def reply(self, deadline: float | None) -> dict:
        """The next message; subprocess.TimeoutExpired past ``deadline``, TemplateGone at
        its end."""
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], wait)[0]:
                raise subprocess.TimeoutExpired("validation process", wait or 0)
            chunk = os.read(fd, 65536)
            if not chunk:
                raise TemplateGone(f"the template exited ({self._proc.wait()})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        """Killed, not asked to exit: it holds nothing but imports."""
        with contextlib.suppress(OSError):
            self._proc.kill()
        self._proc.wait()
        for pipe in (self._proc.stdin, self._proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()


def env_key(env: dict[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if k not in VOLATILE))


_TEMPLATES: list[Template] = []
_LOCK = threading.Lock()


def _acquire(env: dict[str, str]) -> Template | None:
    """An idle template for ``env`` (started if none), marked busy; None where one for it
    is busy already (a second validation at once runs in a fresh interpreter)."""
    key = env_key(env)
    with _LOCK:
        for ended in [t for t in _TEMPLATES if not t.alive()]:
            _TEMPLATES.remove(ended)
            ended.close()
        same = [t for t in _TEMPLATES if t.key == key]
        if any(t.busy for t in same):
            return None
        template = same[0] if same else Template(env)
        if not same:
            _TEMPLATES.append(template)
            idle = [t for t in _TEMPLATES if not t.busy and t is not template]
            for old in idle[:max(0, len(_TEMPLATES) - KEPT)]:
                _TEMPLATES.remove(old)
                old.close()
        template.busy = True
        return template


def _release(template: Template, usable: bool) -> None:
    with _LOCK:
        template.busy = False
        if not usable and template in _TEMPLATES:
            _TEMPLATES.remove(template)
            template.close()


@atexit.register
def close_all() -> None:
    """End this process's templates (at exit; a running child dies with its template)."""
    with _LOCK:
        done, _TEMPLATES[:] = list(_TEMPLATES), []
    for template in done:
        if template.owner == os.getpid():
            template.close()


def _forget_after_fork() -> None:
    """A forked process starts its own templates: the inherited ones serve the parent."""
    global _LOCK
    _TEMPLATES.clear()
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


class Child:
    """``python -m ARGV`` with ``env``, its stdout and stderr in files of ``folder``:
    forked from a template where one serves, else a fresh interpreter. Popen's interface
    as the validation uses it: wait, kill, returncode, output."""

    def __init__(self, argv: list[str], env: dict[str, str], folder: Path) -> None:
        self.argv, self.env = argv, env
        self._out, self._err = folder / "child.stdout", folder / "child.stderr"
        for path in (self._out, self._err):
            path.touch(mode=0o600)
        self.returncode: int | None = None
        self._proc: subprocess.Popen | None = None
        self._template = _acquire(env) if AVAILABLE else None
        self._pid: int | None = None
        self._closing = False  # while closing, a template that is gone starts nothing new
        if self._template is not None:
            try:
                self._template.send({"argv": argv, "env": env, "cwd": os.getcwd(),
                                     "stdout": str(self._out), "stderr": str(self._err)})
            except (TemplateGone, OSError) as exc:
                self._fresh(exc)
        if self._template is None and self._proc is None:
            self._fresh(None)

    def _fresh(self, why: BaseException | None) -> None:
        """A fresh interpreter instead (``why`` the template could not serve)."""
        if why is not None:
            log.debug("validation process: a fresh interpreter (%s)", why)
        if self._template is not None:
            _release(self._template, usable=False)
            self._template = None
        with open(self._out, "wb") as out, open(self._err, "wb") as err:
            self._proc = subprocess.Popen([sys.executable, "-m", *self.argv],
                                          stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                          env=self.env)

    def wait(self, timeout: float | None = None) -> int:
        """The exit code (``-SIGNAL`` for a signal); subprocess.TimeoutExpired after
        ``timeout`` seconds, the child still running."""
        if self.returncode is not None:
            return self.returncode
        if self._template is not None:
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                self._await_template(deadline)
            except TemplateGone as exc:
                if self._pid is None and not self._closing:  # never forked: run it afresh
                    self._fresh(exc)
                    return self.wait(None if deadline is None
                                     else max(0.0, deadline - time.monotonic()))
                self._finish(-signal.SIGKILL, usable=False)  # died with its template
        else:
            self.returncode = self._proc.wait(timeout)
        return self.returncode

    def _await_template(self, deadline: float | None) -> None:
        while self.returncode is None:
            message = self._template.reply(deadline)
            if "pid" in message:
                self._pid = message["pid"]
            elif "exit" in message:
                self._finish(message["exit"], usable=True)

    def _finish(self, code: int, usable: bool) -> None:
        self.returncode = code
        _release(self._template, usable)
        self._template = None

    def kill(self) -> None:
        """SIGKILL, where it still runs (wait() then reaps it)."""
        if self.returncode is not None:
            return
        if self._template is not None:
            with contextlib.suppress(TemplateGone):
                self._template.send({"kill": True})
        elif self._proc is not None:
            self._proc.kill()

    def output(self) -> tuple[str, str]:
        """What it printed: (stdout, stderr)."""
        return (self._out.read_text(errors="replace"), self._err.read_text(errors="replace"))

    def close(self) -> None:
        """Killed and reaped if it still runs."""
        if self.returncode is None:
            self._closing = True
            self.kill()
            self.wait()
