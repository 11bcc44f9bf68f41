"""AOTInductor executor: runs a compiled ``.pt2`` package (CPU or CUDA)."""

from __future__ import annotations

import contextlib
import os
import weakref
from pathlib import Path
from typing import Iterator

import torch

from runtime import scratch
from runtime.errors import ExecutionError
from runtime.manifest import Partition
from runtime.program import Executor

FILE_KEYS = ("package",)  # meta values opened as files: checked entry names


def load(partition: Partition, files_dir: Path, *, where: str,
         run_single_threaded: bool = False, **_: object) -> Executor:
    package = files_dir / partition.meta["package"]
    # torch's Python loader (aoti_load_package) first compares the package's CPU
    # ISA with this host's by compiling probe programs (6-10 compiler runs: 28-43 s
    # of a load on the GPU machine's cold cache) and then only warns. We load with
    # the C++ loader it wraps instead: runtime.hostinfo has already checked the
    # ISA and CUDA capability exactly, from the manifest, before this point.
    # The loader unpacks the package into an ``aotinductor_*`` folder under $TMPDIR and
    # leaves it behind when loading fails; pointed at a recorded folder of ours, every
    # such folder is removed: now on failure, with the executor otherwise.
    unpacked = scratch.make_dir("aoti-load-")
    try:
        with _tmpdir(unpacked):
            loader = torch._C._aoti.AOTIModelPackageLoader(
                str(package), "model", run_single_threaded, 1, -1)
    except Exception as exc:  # torch raises RuntimeError and friends; say which partition failed
        scratch.remove(unpacked)
        raise ExecutionError(
            f"AOTInductor could not load partition '{partition.name}' "
            f"({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''})",
            where=f"{where}: {partition.meta['package']}",
            hint="check that this machine's torch matches the one in `exporter inspect`") from exc
    # The loader's flat interface: our Program already flattened the inputs and
    # names the outputs, so the package's pytree specs (which may name model
    # classes that are not importable on the device) are never needed.

    if partition.device == "cuda":
        def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
            with _full_fp32():
                return loader.run([t.contiguous() for t in inputs])
    else:
        def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
            return loader.run([t.contiguous() for t in inputs])

    weakref.finalize(run, scratch.remove, unpacked)
    return run


@contextlib.contextmanager
def _full_fp32() -> Iterator[None]:
    """float32 math means float32 inside the artifact, whatever the process has set:
    PyTorch lets cuDNN use TF32 (10-bit mantissas) for float32 convolutions by default,
    and the compiled package calls aten's convolution. A Hugging Face ResNet validated
    at 0.02x its fp32 allowance without TF32 and failed at 17.6x with it (H100). Set
    around each call (and so around CUDA-graph capture, which fixes the kernels)."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = cudnn.allow_tf32, matmul.allow_tf32
    cudnn.allow_tf32 = matmul.allow_tf32 = False
    try:
        yield
    finally:
        cudnn.allow_tf32, matmul.allow_tf32 = saved


@contextlib.contextmanager
def _tmpdir(path: Path) -> Iterator[None]:
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old
