"""TVM executor: runs one partition's exported Relax library on the Relax VM (CPU).

``tvm`` is imported inside ``load``, so a device without it can still run other
backends. Weights come from the partition's safetensors file (checked against the
manifest like every entry) and are handed to ``main`` after the inputs, as the
exporter's ``detach_params`` left them. Tensors cross by DLPack, without copies.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from runtime.errors import CompatibilityError, ExecutionError
from runtime.manifest import Partition
from runtime.program import Executor
from runtime.weights import INDEX_KEY, load_checked

FILE_KEYS = ("library", "params")  # meta values opened as files: checked entry names


def load(partition: Partition, files_dir: Path, *, where: str, **_: object) -> Executor:
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
            where=where, hint="pip install apache-tvm (the version in `exporter inspect`)") from None
    meta = partition.meta
    where = f"{where}: {meta['library']}"
    try:
        library = tvm.runtime.load_module(str(files_dir / meta["library"]))
        vm = relax.VirtualMachine(library, tvm.cpu())
    except Exception as exc:  # TVM raises TVMError subclasses; say which partition
        raise ExecutionError(f"TVM could not load partition '{partition.name}' "
                             f"({type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]})",
                             where=where, hint="check the TVM version in `exporter inspect`") from exc
    weights = load_checked(files_dir / meta["params"], (meta.get(INDEX_KEY) or {}).get("params"),
                           "cpu", where=where)
    if len(weights) != meta["num_params"]:
        raise ExecutionError(f"partition '{partition.name}' has {len(weights)} weights, its "
                             f"manifest says {meta['num_params']}", where=where)
    # Copied into TVM's allocations: TVM needs 64-byte aligned data, and tensors in a
    # safetensors file are packed back to back.
    params = [tvm.runtime.tensor(weights[name].numpy()) for name in sorted(weights)]
    main = vm["main"]

    def to_tvm(tensor: torch.Tensor):
        tensor = tensor.contiguous()
        if tensor.data_ptr() % 64 == 0:
            return tvm.runtime.from_dlpack(tensor)  # no copy
        return tvm.runtime.tensor(tensor.numpy())  # a view into a larger tensor, say

    def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        try:
            out = main(*[to_tvm(t) for t in inputs], *params)
        except Exception as exc:  # a shape the VM's own checks refuse, and the like
            raise ExecutionError(f"TVM failed running partition '{partition.name}' "
                                 f"({type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]})",
                                 where=where) from exc
        # main returns a tuple (an ffi Array) of outputs; a lone tensor has a shape.
        return [torch.from_dlpack(o) for o in ([out] if hasattr(out, "shape") else out)]

    run.report = {"tvm": tvm.__version__, "tvm_target": meta.get("tvm_target"),
                  "schedules": meta.get("schedules")}
    return run
