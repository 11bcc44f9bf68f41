"""ExecuTorch executor: runs one partition's ``.pte`` program with ExecuTorch's runtime
(the wheel's portable/optimized kernels and its XNNPACK backend).

``executorch`` is imported inside ``load``, so a device without it can still run other
backends. Its Python runtime takes and gives torch tensors (numpy arrays are refused),
so this kind is not one of runtime/program/requires.py's array kinds. The program is opened
with ExecuTorch's full flatbuffer verification (InternalConsistency): a verified entry
ExecuTorch still refuses is a broken artifact, said as such.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.errors import ArtifactError, CompatibilityError, ExecutionError
from runtime.executors.meta import Entry, PartitionMeta
from runtime.format.manifest import Partition
from runtime.host.stderr_filter import lines_dropped

log = logging.getLogger(__name__)

_REBUILD = "rebuild the artifact with `exporter build --target executorch`"


@dataclass(frozen=True)
class ExecutorchMeta(PartitionMeta):
    program: Entry  # the .pte program
    method: str = "forward"  # the method the partition runs
    executorch: str | None = None  # the ExecuTorch version of the build (report, bundle)
    xnnpack_ops: int | None = None  # ops inside XNNPACK delegates
    portable_ops: int | None = None  # ops run by ExecuTorch's own kernels
    delegates: int | None = None  # XNNPACK subgraphs
    # the nodes inside each XNNPACK subgraph, in run order (bisect names a culprit's)
    subgraphs: tuple[tuple[str, ...], ...] | None = None
    kernels: tuple[str, ...] | None = None  # the kernels the program calls (report)
    # edge op -> {"XNNPACK": n, "portable": n}: the report's placement inside ExecuTorch
    placement: dict[str, dict[str, int]] | None = None
    # ExecuTorch's memory planning: the arenas it sized (index 0 is reserved), in bytes,
    # for the upper bound of every dynamic dim (``bounds``)
    buffer_sizes: tuple[int, ...] | None = None
    planned_bytes: int | None = None
    bounds: dict[str, str] | None = None


class ExecutorchExecutor:
    Meta = ExecutorchMeta
    portable = True  # a .pte program: the kernels are the runtime's, on any platform
    arena_slots = 0  # ExecuTorch owns its planned arenas

    def __init__(self, method, partition: str, where: str, report: dict) -> None:
        self._method = method
        self._partition = partition
        self._where = where
        self._report = report

    @classmethod
    def load(cls, partition: Partition, meta: ExecutorchMeta, files_dir: Path, *,
             where: str, **_: object) -> ExecutorchExecutor:
        try:
            from runtime.executors import executorch_pybind as et
            levels = et.verification_levels()
        except ImportError:
            raise CompatibilityError(
                f"partition '{partition.name}' runs on ExecuTorch, which is not installed",
                where=where, hint="pip install executorch (the version in `exporter "
                                  "inspect`), or install the runtime's 'executorch' extra"
            ) from None
        where = f"{where}: {meta.program}"
        if any(k.startswith("quantized_decomposed::") for k in meta.kernels or ()):
            import executorch.kernels.quantized  # noqa: F401 - q/dq outside XNNPACK
        with lines_dropped(_cpu_probing_line):  # the thread pool starting (stderr_filter.py)
            method = _open(et, levels, files_dir / meta.program, meta.method, partition.name,
                           where)
        found = method.metadata
        if (found.num_inputs(), found.num_outputs()) != (len(partition.inputs),
                                                          len(partition.outputs)):
            raise ArtifactError(
                f"partition '{partition.name}': the program's method '{meta.method}' takes "
                f"{found.num_inputs()} input(s) and gives {found.num_outputs()}, the "
                f"manifest says {len(partition.inputs)} and {len(partition.outputs)}",
                where=where, hint=_REBUILD)
        report = {"executorch": meta.executorch, "xnnpack_ops": meta.xnnpack_ops,
                  "portable_ops": meta.portable_ops, "delegates": meta.delegates,
                  "planned_bytes": meta.planned_bytes}
        return cls(method, partition.name, where, report)

    def __call__(self, inputs: list[Any]) -> list[Any]:
        try:  # ExecuTorch reads dense tensors in the default dim order
            return list(self._method.execute([t.contiguous() for t in inputs]))
        except RuntimeError as exc:  # a shape beyond the planned bounds, and the like
            raise ExecutionError(f"ExecuTorch failed running partition '{self._partition}' "
                                 f"({_first_line(exc)})", where=self._where) from exc

    def report(self) -> dict:
        return {k: v for k, v in self._report.items() if v is not None}


def _open(et, verification, path: Path, method: str, partition: str, where: str):
    """The loaded method, or ArtifactError: a program ExecuTorch refuses (its verifier, a
    missing method, a delegate blob XNNPACK cannot read) is a broken artifact."""
    try:
        program = et.load_program(path, verification=verification.InternalConsistency)
    except (RuntimeError, ValueError) as exc:
        raise ArtifactError(f"ExecuTorch could not load partition '{partition}' "
                            f"({_first_line(exc)})", where=where, hint=_REBUILD) from exc
    if method not in program.method_names:
        raise ArtifactError(f"partition '{partition}': the program has no method "
                            f"'{method}' (it has: {', '.join(sorted(program.method_names))})",
                            where=where, hint=_REBUILD)
    try:
        return program.load_method(method)
    except (RuntimeError, ValueError) as exc:
        raise ArtifactError(f"ExecuTorch could not load method '{method}' of partition "
                            f"'{partition}' ({_first_line(exc)})", where=where,
                            hint=_REBUILD) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"


def _cpu_probing_line(line: str) -> bool:
    return line.startswith("[cpuinfo_utils.cpp:")
