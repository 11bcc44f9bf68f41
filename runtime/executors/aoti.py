"""AOTInductor executor: runs a compiled ``.pt2`` package (CPU or CUDA)."""

from __future__ import annotations

import contextlib
import os
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from runtime.errors import ArtifactError
from runtime.executors.meta import Entry, PartitionMeta
from runtime.format.manifest import Partition
from runtime.host import scratch
from runtime.memory.shared_weights import SharedWeights, missing_store


@dataclass(frozen=True)
class AotiMeta(PartitionMeta):
    package: Entry  # the .pt2 package
    inductor_configs: dict | None = None  # the Inductor settings it was compiled with (report)
    compiler: str | None = None  # which C++ compiler, and why (report)
    # CPU: the library reads its constants where its own load put them, not from aligned
    # copies (aligned_cpu_runner): artifacts whose cpu choice offered that say so here;
    # builds no longer write it (the copies ran faster on every CPU measured)
    constants_as_loaded: bool | None = None
    # outputs (by index) that are rows the library's kernels also stored into the step's
    # cache inputs (targets/aoti/passes/attention_store.py): a caller that reads the
    # cache may leave them (Program.run_in_place)
    stored_outputs: tuple[int, ...] | None = None


class AotiExecutor:
    Meta = AotiMeta
    arena_slots = 0  # the package allocates its own intermediates

    def __init__(self, loader, unpacked: Path, *, full_fp32: bool,
                 stored_outputs: tuple[int, ...] = ()) -> None:
        self._run = loader.run
        self._full_fp32 = full_fp32
        self.stored_outputs = stored_outputs  # AotiMeta.stored_outputs
        weakref.finalize(self, scratch.remove, unpacked)

    @classmethod
    def load(cls, partition: Partition, meta: AotiMeta, files_dir: Path, *, where: str,
             run_single_threaded: bool = False, shared: SharedWeights | None = None,
             **_: object) -> AotiExecutor:
        # torch's Python loader (aoti_load_package) first compares the package's CPU
        # ISA with this host's by compiling probe programs (6-10 compiler runs: 28-43 s
        # of a load on the GPU machine's cold cache) and then only warns. We load with
        # the C++ loader it wraps instead: runtime.host.hostinfo has already checked the
        # ISA and CUDA capability exactly, from the manifest, before this point.
        # The loader unpacks the package into an ``aotinductor_*`` folder under $TMPDIR and
        # leaves it behind when loading fails; pointed at a recorded folder of ours, every
        # such folder is removed: now on failure, with the executor otherwise.
        unpacked = scratch.make_dir("aoti-load-")
        if (partition.device == "cpu" and not meta.shared_weights and not run_single_threaded
                and not meta.constants_as_loaded):
            runner = aligned_cpu_runner(files_dir / meta.package, unpacked)
            if runner is not None:
                return cls(runner, unpacked, full_fp32=False)
        try:
            with _tmpdir(unpacked):
                loader = torch._C._aoti.AOTIModelPackageLoader(
                    str(files_dir / meta.package), "model", run_single_threaded, 1, -1)
        except Exception as exc:  # a verified package that torch refuses is bad input
            scratch.remove(unpacked)
            text = str(exc).strip()
            raise ArtifactError(
                f"AOTInductor could not load partition '{partition.name}' "
                f"({type(exc).__name__}: {text.splitlines()[0] if text else ''})",
                where=f"{where}: {meta.package}",
                hint="the package is broken or was built for another torch (check that this "
                     "machine's matches the one in `exporter inspect`); rebuild the artifact "
                     "with `exporter build`") from exc
        if meta.shared_weights:
            _load_shared(loader, partition, meta, shared, unpacked, where)
        # The loader's flat interface: our Program already flattened the inputs and
        # names the outputs, so the package's pytree specs (which may name model
        # classes that are not importable on the device) are never needed.
        stored = tuple(meta.stored_outputs or ())
        if any(not 0 <= index < len(partition.outputs) for index in stored):
            scratch.remove(unpacked)
            raise ArtifactError(f"partition '{partition.name}' names stored outputs it does "
                                "not have", where=f"{where}: {meta.package}",
                                hint="rebuild the artifact with `exporter build`")
        return cls(loader, unpacked, full_fp32=partition.device == "cuda",
                   stored_outputs=stored)

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if self._full_fp32:
            with _full_fp32():
                return self._run([t.contiguous() for t in inputs])
        return self._run([t.contiguous() for t in inputs])

    def report(self) -> dict:
        return {}


def aligned_cpu_runner(package: Path, folder: Path):
    """The package's CPU library in a container runner, its constants moved to 64-byte
    aligned memory where oneDNN reads packed weights among them; None where the package
    is not one plain library (the package loader takes it then).

    The library copies its constants into one ``malloc`` block at load, at 64-byte offsets
    from a base that glibc aligns to 16 only, and oneDNN's packed weights were read across
    cache lines: two packed 197x768x3072 linears took 1.15-1.24x as long as with aligned
    copies (bench/aoti_constant_alignment.py, bench/RESULTS.md 2026-11-30); on MKL's
    unpacked weights the copies did not help. So where the oneDNN constants are float32,
    each constant is copied (torch's copies are aligned), the copies made the active
    buffer and the library's own block freed."""
    import zipfile

    try:
        with zipfile.ZipFile(package) as archive:
            members = [m for m in archive.namelist() if "/data/aotinductor/model/" in m]
            libraries = [m for m in members if m.endswith(".so")]
            if len(libraries) != 1:
                return None
            archive.extractall(folder, members)
        runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(folder / libraries[0]), 1)
        current = runner.extract_constants_map(False)
        packed = [t for t in current.values() if t.layout == torch._mkldnn]
        # int8 packed weights (PT2E recipes) carry oneDNN's quantization state, which a
        # clone does not keep (a CNN's outputs came out at -26 dB): they run as loaded
        if not packed or any(t.dtype != torch.float32 for t in packed):
            return _Runner(runner, {})
        copies = {fqn: t.clone() for fqn, t in current.items()}
        del current  # views of the block freed below
        fqns = runner.get_constant_names_to_original_fqns()
        runner.update_constant_buffer({name: copies[fqn] for name, fqn in fqns.items()},
                                      True, True, True)  # inactive, every one, ours
        runner.swap_constant_buffer()
        runner.free_inactive_constant_buffer()
    except (RuntimeError, KeyError, OSError, zipfile.BadZipFile):
        return None  # the package loader's way, and its error if the package is bad
    return _Runner(runner, copies)


@dataclass(frozen=True)
class _Runner:
    """A container runner and the constants it reads (user-managed: kept alive here)."""
    runner: object
    constants: dict

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return self.runner.run(inputs)


def _load_shared(loader, partition: Partition, meta: AotiMeta, shared: SharedWeights | None,
                 unpacked: Path, where: str) -> None:
    """A package compiled without its weights gets them from the shared store, as
    user-managed constants: the package keeps pointers to the store's tensors, so every
    package of the artifact reads one copy."""
    if shared is None:
        scratch.remove(unpacked)
        raise missing_store(partition.name, where=where)
    tensors = shared.tensors(meta.shared_weights, partition.device, partition=partition.name)
    try:
        loader.load_constants(tensors, False, True, True)  # active buffer, all of them, shared
    except RuntimeError as exc:
        scratch.remove(unpacked)
        raise ArtifactError(f"partition '{partition.name}' does not accept the shared weights "
                            f"({str(exc).strip().splitlines()[0][:200]})", where=where,
                            hint="rebuild the artifact with `exporter build`") from exc


@contextlib.contextmanager
def _full_fp32() -> Iterator[None]:
    """float32 math means float32 inside the artifact, whatever the process has set:
    PyTorch lets cuDNN use TF32 (10-bit mantissas) for float32 convolutions by default,
    and the compiled package calls aten's convolution, enough to fail a ResNet's
    validation (docs/design-notes.md). Set around each call (and so around CUDA-graph
    capture, which fixes the kernels)."""
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
