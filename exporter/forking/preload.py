"""Importing in a fork server (exporter/forking/server.py) without taking CUDA, or
threads, from the children it forks.

A process forked after CUDA was initialized cannot use CUDA ("Cannot re-initialize CUDA
in forked subprocess"). On the GPU machine, importing transformers.modeling_utils
initializes it (torchao asks for the GPU's capability at import); every onnx cell
forked after that failed torch.onnx's decompositions and ran wholly on the CPU
fallback. So:

- the imports run with torch asked to count GPUs through NVML
  (``PYTORCH_NVML_BASED_CUDA_CHECK``, PyTorch's advice for code that forks): through the
  CUDA runtime, even counting them poisons every later fork;
- a warm process whose cells use no GPU imports with none in sight
  (``CUDA_VISIBLE_DEVICES=""``), so nothing can initialize CUDA; its cells get the
  environment back, and an ONNX Runtime or validation process they start sees the GPU;
- one whose cells may use the GPU first imports each module in a throwaway fork, and a
  module that initializes CUDA there is left for each cell to import;
- if, after all that, a fork would still find CUDA poisoned, cells start in a fresh
  interpreter (the server says why);
- a fork keeps none of its parent's threads: where the client asks (``threads``), an
  import that started any (OpenMP's pool, onnxruntime's, TVM's) makes children start in
  a fresh interpreter too. numpy's OpenBLAS threads are fork-safe and not counted.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def preload(modules: list[str], gpu: bool, threads: bool = False) -> str | None:
    """Import ``modules``; None when a fork of this process can run its cells, else why
    not. ``gpu``: whether those cells may use a GPU; ``threads``: whether an import that
    started threads makes forking unsafe."""
    hidden = {} if gpu else {"CUDA_VISIBLE_DEVICES": ""}
    before = _threads()
    with _environ({NVML_CHECK: "1", **hidden}):
        for name in modules:  # a module that fails to import is the cell's to report
            if gpu and _gpu_in_sight() and _initializes_cuda(name):
                _say(f"importing {name} initializes CUDA: each cell imports it itself")
                continue
            try:
                __import__(name)
            except Exception as exc:  # noqa: BLE001
                _say(f"could not import {name}: {type(exc).__name__}: {exc}")
            if name == "numpy":  # OpenBLAS starts its threads at load (and is fork-safe)
                before = _threads()
    if threads and _threads() > before:
        why = "an import started threads (a fork would lose them)"
        _say(f"{why}; cells start in a fresh interpreter")
        return why
    if _forks_lose_cuda():
        why = ("the warm process's imports touched CUDA, which a forked process cannot use "
               f"(imported: {', '.join(modules)})")
        _say(f"{why}; cells start in a fresh interpreter")
        return why
    return None


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """``values`` set in os.environ for the block, then each put back as it was."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _gpu_in_sight() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda._is_compiled() and torch.cuda.device_count())


def _initializes_cuda(name: str) -> bool:
    """Whether importing ``name`` here would initialize CUDA, tried in a fork."""
    pid = os.fork()
    if pid == 0:
        import torch
        try:
            __import__(name)
        except BaseException:  # noqa: BLE001  the real import reports it
            os._exit(0)
        os._exit(1 if torch.cuda.is_initialized() else 0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 1


def _forks_lose_cuda() -> bool:
    """Whether a child forked now finds torch's CUDA poisoned ("in bad fork"): set once
    this process initialized CUDA, or counted devices through the CUDA runtime."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda._is_compiled():
        return False
    if torch.cuda.is_initialized():
        return True
    pid = os.fork()
    if pid == 0:
        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 1


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _say(line: str) -> None:
    print(f"fork server: {line}", file=sys.stderr, flush=True)
