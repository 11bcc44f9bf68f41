"""AOTInductor executor: runs a compiled ``.pt2`` package (CPU or CUDA)."""

from __future__ import annotations

from pathlib import Path

import torch

from runtime.errors import ExecutionError
from runtime.manifest import Partition
from runtime.program import Executor


def load(partition: Partition, files_dir: Path, *, where: str,
         run_single_threaded: bool = False, **_: object) -> Executor:
    package = files_dir / partition.meta["package"]
    # torch's loader compares the package's CPU ISA with this host's by compiling
    # probe programs (about 10 compiler runs: 43 s of a 44 s load on the GPU
    # machine) and then only warns. runtime.hostinfo has already checked the
    # ISA exactly from the CPU's flags, so tell Inductor the compiler probe passed.
    from torch._inductor import config as inductor_config
    try:
        with inductor_config.patch({"cpp.vec_isa_ok": True}):
            compiled = torch._inductor.aoti_load_package(
                str(package), run_single_threaded=run_single_threaded)
    except Exception as exc:  # torch raises RuntimeError and friends; say which partition failed
        raise ExecutionError(
            f"AOTInductor could not load partition '{partition.name}' "
            f"({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''})",
            where=f"{where}: {partition.meta['package']}",
            hint="check that this machine's torch matches the one in `exporter inspect`") from exc
    # The loader's flat interface: our Program already flattened the inputs and
    # names the outputs, so the package's pytree specs (which may name model
    # classes that are not importable on the device) are never needed.
    loader = compiled.loader

    def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return loader.run([t.contiguous() for t in inputs])

    return run
