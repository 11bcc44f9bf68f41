"""The validation process: ``python -m MODULE ARGS`` (the runtime's ``run-cases``,
generation's cases, a cross build's runner under qemu) in a process of its own, forked from
a template that imported torch and the runtime once (a fork server: exporter/forking/)
instead of a fresh interpreter that imports them again for every build: a torch import is
seconds of CPU, and a test run or a coverage matrix validates hundreds of builds.

The child is what the fresh interpreter was: its own pid, arguments, environment, working
folder, stdout and stderr, exit code or signal, and a crash stays in it; it stays in the
build's process group, so the terminal's Ctrl-C reaches it. The template is started on
the first validation, with the child's environment: where a later validation's
environment differs, another template is started (imports read it: OpenMP, CUDA). Where
no template can serve (not Linux, one busy in this thread's other validation, one that
died), the child is a fresh interpreter, as before.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from exporter.forking import client
from exporter.forking.client import ServerGone

log = logging.getLogger(__name__)

# What every validation child imports before it reads its artifact. Not onnxruntime or
# TVM: their imports start threads, and a fork keeps none of a parent's threads.
PRELOAD = ("numpy", "torch", "safetensors.torch", "runtime", "runtime.__main__",
           "runtime.program.torch_program", "runtime.executors.torch_fallback",
           "runtime.generation")
KEPT = 2  # idle templates kept: one environment, and one a test or a matrix cell changed
# Never read by PRELOAD's imports (terminal size is read when used; no Hugging Face library
# or TVM is among them): a template started without them serves any value, each child
# getting its own. HF_HUB_OFFLINE (set while an hf: spec loads), a TVM run's
# TVM_NUM_THREADS and the CLI's COLUMNS each started another template (4 CPU s).
_UNREAD_AT_IMPORT = ("COLUMNS", "LINES")
_UNIMPORTED = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TVM_")
AVAILABLE = client.AVAILABLE


def _template(env: dict[str, str], modules: tuple[str, ...]) -> client.ForkServer:
    """Not in a session of its own, and not dying with the thread that started it (any
    thread's validation may use it): it ends when this process's end closes its input.
    An import that started threads makes its children start fresh."""
    return client.ForkServer(env, modules, name="validation template", threads=True)


TEMPLATES = client.Pool(_template, kept=KEPT)


def _template_env(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items()
            if name not in _UNREAD_AT_IMPORT and not name.startswith(_UNIMPORTED)}


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
        self._template = TEMPLATES.acquire(_template_env(env), PRELOAD) if AVAILABLE else None
        self._pid: int | None = None
        self._closing = False  # while closing, a template that is gone starts nothing new
        if self._template is not None:
            try:
                self._template.start(argv, env, os.getcwd(), self._out, self._err)
            except (ServerGone, OSError) as exc:
                self._fresh(exc)
        if self._template is None and self._proc is None:
            self._fresh(None)

    def _fresh(self, why: BaseException | None) -> None:
        """A fresh interpreter instead (``why`` the template could not serve)."""
        if why is not None:
            log.debug("validation process: a fresh interpreter (%s)", why)
        if self._template is not None:
            TEMPLATES.release(self._template, usable=False)
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
            except ServerGone as exc:
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
        TEMPLATES.release(self._template, usable)
        self._template = None

    def kill(self) -> None:
        """SIGKILL, where it still runs (wait() then reaps it)."""
        if self.returncode is not None:
            return
        if self._template is not None:
            self._template.kill()
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
