"""TVM executor: runs one partition's exported Relax library on the Relax VM (CPU).

``tvm`` is imported inside ``load``, so a device without it can still run other
backends. Weights come from the partition's safetensors file (checked against the
manifest like every entry) and are handed to ``main`` after the inputs, as the
exporter's ``detach_params`` left them. Tensors cross by DLPack, without copies: torch
tensors, or numpy arrays when loaded with ``arrays=True`` (a device without torch).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.errors import ArtifactError, CompatibilityError, ExecutionError
from runtime.executors.meta import Entry, PartitionMeta
from runtime.format.manifest import Partition
from runtime.format.weights import load_checked
from runtime.host.stderr_filter import lines_dropped


@dataclass(frozen=True)
class TvmMeta(PartitionMeta):
    library: Entry  # the exported Relax library (.so)
    params: Entry  # its weights (safetensors), handed to main after the inputs
    num_params: int  # how many; checked against the file
    # runtime.format.weights.INDEX_KEY: {"params": the weights file's index}, checked before reading
    tensor_index: dict[str, dict] | None = None
    tvm_target: str | None = None  # the TVM target string it was compiled for (report)
    platform: str | None = None  # the platform its library's code is for ("linux-aarch64")
    isa: str | None = None  # the CPU ISA that code needs ("avx512", "armv8-a+neon")
    tvm: str | None = None  # the TVM version of the build (report, `exporter bundle`)
    tune_trials: int | None = None  # MetaSchedule trials (0: untuned)
    schedules: dict | None = None  # how the kernels were scheduled (report)


class TvmExecutor:
    Meta = TvmMeta
    arena_slots = 0  # the VM allocates its own memory
    arrays = True  # runs on numpy arrays where torch is missing (runtime/program/requires.py)
    array_packages = ("safetensors",)  # reads its weights; tvm itself is the target's package

    def __init__(self, tvm, main, params: list, partition: str, where: str,
                 report: dict, from_dlpack) -> None:
        self._tvm = tvm  # the module, imported by load
        self._from_dlpack = from_dlpack  # torch.from_dlpack, or numpy's (arrays)
        self._main = main
        self._params = params
        self._partition = partition
        self._where = where
        self._report = report

    @classmethod
    def load(cls, partition: Partition, meta: TvmMeta, files_dir: Path, *, where: str,
             arrays: bool = False, **_: object) -> TvmExecutor:
        # TVM's thread pool counts physical cores by its own rule and used 1 thread on a
        # 2-vCPU machine; it reads TVM_NUM_THREADS when it starts. A user's setting wins.
        os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))
                                                     if hasattr(os, "sched_getaffinity")
                                                     else os.cpu_count() or 1))
        try:
            import tvm
            from tvm import relax
        except ImportError:
            raise CompatibilityError(
                f"partition '{partition.name}' runs on Apache TVM, which is not installed",
                where=where, hint="pip install apache-tvm (the version in `exporter inspect`)"
            ) from None
        where = f"{where}: {meta.library}"
        try:
            with lines_dropped(_scope_line):  # TVM's own log (stderr_filter.py)
                library = tvm.runtime.load_module(str(files_dir / meta.library))
                vm = relax.VirtualMachine(library, tvm.cpu())
        except Exception as exc:  # TVMError: a verified library TVM refuses is bad input
            raise ArtifactError(f"TVM could not load partition '{partition.name}' "
                                f"({_last_line(exc)})", where=where,
                                hint="the library is broken or was built for another TVM "
                                     "(its version is in `exporter inspect`); rebuild the "
                                     "artifact with `exporter build`") from exc
        weights = load_checked(files_dir / meta.params, (meta.tensor_index or {}).get("params"),
                               "cpu", where=where, arrays=True)
        if len(weights) != meta.num_params:
            raise ArtifactError(f"partition '{partition.name}' has {len(weights)} weights, its "
                                f"manifest says {meta.num_params}", where=where,
                                hint="rebuild the artifact with `exporter build`")
        # Copied into TVM's allocations: TVM needs 64-byte aligned data, and tensors in a
        # safetensors file are packed back to back.
        params = [tvm.runtime.tensor(weights[name]) for name in sorted(weights)]
        report = {"tvm": tvm.__version__, "tvm_target": meta.tvm_target,
                  "schedules": meta.schedules}
        if arrays:
            import numpy
            from_dlpack = numpy.from_dlpack
        else:
            import torch
            from_dlpack = torch.from_dlpack
        return cls(tvm, vm["main"], params, partition.name, where, report, from_dlpack)

    def __call__(self, inputs: list[Any]) -> list[Any]:
        try:
            out = self._main(*[self._to_tvm(t) for t in inputs], *self._params)
        except Exception as exc:  # a shape the VM's own checks refuse, and the like
            raise ExecutionError(f"TVM failed running partition '{self._partition}' "
                                 f"({_last_line(exc)})", where=self._where) from exc
        # main returns a tuple (an ffi Array) of outputs; a lone tensor has a shape.
        return [self._from_dlpack(o) for o in ([out] if hasattr(out, "shape") else out)]

    def report(self) -> dict:
        return dict(self._report)

    def _to_tvm(self, tensor: Any):
        """A torch tensor or a numpy array as a TVM tensor: shared when it is dense and
        64-byte aligned, as TVM requires, else copied (a view into a larger one, say)."""
        if hasattr(tensor, "data_ptr"):  # torch
            tensor = tensor.contiguous()
            if tensor.data_ptr() % 64 == 0:
                return self._tvm.runtime.from_dlpack(tensor)
            return self._tvm.runtime.tensor(tensor.numpy())
        if tensor.flags.c_contiguous and tensor.ctypes.data % 64 == 0:
            return self._tvm.runtime.from_dlpack(tensor)
        return self._tvm.runtime.tensor(tensor)  # numpy's copy is C-ordered


def _last_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ''}"


def _scope_line(line: str) -> bool:
    return "executable.cc" in line and ": Warning: Scope Loaded:" in line
