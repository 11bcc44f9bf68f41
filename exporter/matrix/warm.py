"""Warm workers: each cell's ``exporter`` process forked from one that imported torch,
transformers (where a cell's model may use it), the builder and the targets' compilers
once, instead of a fresh interpreter that imports them again for every cell (a fork
server: exporter/forking/).

A fresh ``python -m exporter build`` spends 5-9 s importing before it reads its model (2
cores: torch 2.6 s, transformers 2.6 s, Inductor 3.2 s, TVM 1.6 s); a small onnx cell
took 16 s cold and 9 s forked. A cell is still its own process, in its own session, with
its own time limit, stdout and exit code, as ``python -m exporter`` gives them.

One warm process per worker (a pool thread, or a Ray worker process), keyed by what it
was started with: the cell's environment is read at import, so a cell whose environment
differs gets another warm process. It serves one cell at a time and dies with whoever
started it (Linux's parent-death signal), and each cell dies with it, so a Ray worker
killed mid-build takes its build along, as a cold cell does.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from exporter.forking import client
from runtime.host import scratch

# what every cell imports before it reads its model (the CLI's own modules add 0.2 s);
# a target adds its compilers (Target.packaging.build_modules), a model that may use
# transformers HF_MODULES
BASE_MODULES = ("torch", "torch.export", "exporter.builder.pipeline")
HF_MODULES = ("transformers", "transformers.modeling_utils")
AVAILABLE = client.AVAILABLE
WarmProcessDied = client.ServerGone  # the warm process ended while a cell ran: a crash


def may_import_transformers(spec: str) -> bool:
    """Whether a cell's model may import transformers, so that its warm worker imports it
    first: hf: specs do and zoo: models never; a model file where its text names it; a
    module spec may (its file is not looked up). transformers and the torchao it imports
    are 2.4 CPU s of a worker's start; a wrong guess costs that once in the cell."""
    if spec.startswith("zoo:"):
        return False
    location = spec.rpartition(":")[0]
    if spec.startswith("hf:") or not location.endswith(".py"):
        return True
    try:
        return "transformers" in Path(location).read_text(errors="replace")
    except OSError:
        return True


class WarmProcess(client.ForkServer):
    """One warm process: cells in sessions of their own, dying with this thread. Its
    imports may start threads (TVM's): cells forked without them have run fine."""

    def __init__(self, env: dict[str, str], modules: tuple[str, ...], gpu: bool = True
                 ) -> None:
        """``gpu``: whether its cells may use a GPU (exporter/forking/preload.py)."""
        super().__init__(env, modules, name="warm worker", session=True, gpu=gpu,
                         die_with_parent=True)
        self._env = dict(env)

    def run(self, args: list[str], cwd: str, timeout: float, on_start) -> tuple[int, str, str]:
        """``exporter ARGS`` in a forked child: (exit code, stdout, stderr), as
        subprocess.run gives them. ``on_start(pid)`` once the child runs.
        subprocess.TimeoutExpired after ``timeout`` s (the child's session killed first)."""
        out = scratch.make_file("exporter-cell-", suffix=".out")
        err = scratch.make_file("exporter-cell-", suffix=".err")
        try:
            self.start(["exporter", *args], self._env, cwd, out, err)
            on_start(self.reply(None)["pid"])
            try:
                code = self.reply(time.monotonic() + timeout)["exit"]
            except subprocess.TimeoutExpired:  # the cell's whole session goes
                self.kill()
                self.reply(None)  # the child reaped
                raise
            return code, out.read_text(errors="replace"), err.read_text(errors="replace")
        finally:
            scratch.remove(out)
            scratch.remove(err)


_POOL = client.Pool(WarmProcess, per_thread=True)


def process_for(env: dict[str, str], modules: tuple[str, ...], gpu: bool = True
                ) -> WarmProcess:
    """This thread's warm process for ``env``, ``modules`` and ``gpu`` (started, or
    restarted after it died)."""
    return _POOL.get(env, modules, gpu=gpu)


def close_all() -> None:
    """End every warm process this process started (at the end of a matrix)."""
    _POOL.close_all()
