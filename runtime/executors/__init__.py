"""One executor per backend kind: partition files + device -> callable on tensors.

Backends are imported lazily so a device only needs the packages of the
backends its artifacts use (onnxruntime and tvm are optional).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from runtime.consistency import check_partition_files
from runtime.errors import ArtifactError, CompatibilityError
from runtime.manifest import Partition
from runtime.program import Executor

_BACKENDS = {
    "aoti": "runtime.executors.aoti",
    "onnxruntime": "runtime.executors.onnxruntime",
    "torch": "runtime.executors.torch_fallback",
    "tvm": "runtime.executors.tvm",
}


def create_executor(partition: Partition, files_dir: Path, *, where: str,
                    entries: set[str] | None = None, **options) -> Executor:
    """``entries``: the verified entry names; each executor's ``FILE_KEYS`` (the meta
    values it opens as files) must name one of them (runtime/consistency.py)."""
    module_name = _BACKENDS.get(partition.backend)
    if module_name is None:
        raise CompatibilityError(
            f"partition '{partition.name}' needs backend '{partition.backend}', which this "
            f"runtime does not have (it has: {', '.join(sorted(_BACKENDS))})", where=where,
            hint="upgrade the runtime to the toolchain version that built the artifact")
    module = importlib.import_module(module_name)
    if entries is not None:
        check_partition_files(partition, module.FILE_KEYS, entries, where=where)
    try:
        return module.load(partition, files_dir, where=where, **options)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        # Executors read their partition's meta as the build wrote it; a missing key or a
        # wrong type there is a malformed (or hostile) manifest, said as such.
        raise ArtifactError(
            f"partition '{partition.name}' ({partition.backend}) has a malformed manifest "
            f"record ({type(exc).__name__}: {str(exc)[:200]})", where=where,
            hint="rebuild the artifact with `exporter build`; --debug shows where") from exc
