"""One executor per backend kind: partition files + device -> callable on tensors.

Each kind is an executor class with ``Meta`` and ``load`` (runtime/executors/base.py),
imported lazily: a device needs only the packages of the backends its artifacts use
(onnxruntime and tvm are optional).
"""

from __future__ import annotations

import importlib
import inspect
import threading
from pathlib import Path
from typing import Any

from runtime.consistency import check_partition_files
from runtime.errors import ArtifactError, CompatibilityError
from runtime.executors.base import Executor, ExecutorKind
from runtime.executors.meta import PartitionMeta
from runtime.manifest import Partition

__all__ = ["Executor", "ExecutorKind", "PartitionMeta", "create_executor", "parse_meta"]

# kind -> its loader, or "module:attribute" / "module" until first used
_KINDS: dict[str, ExecutorKind | str] = {
    "aoti": "runtime.executors.aoti:AotiExecutor",
    "onnxruntime": "runtime.executors.onnxruntime:OnnxRuntimeExecutor",
    "torch": "runtime.executors.torch_fallback:TorchFallbackExecutor",
    "tvm": "runtime.executors.tvm:TvmExecutor",
}
_LOCK = threading.Lock()  # two threads loading artifacts may resolve a kind at once


def parse_meta(partition: Partition, *, where: str) -> PartitionMeta:
    """``partition.meta`` checked by its kind's Meta dataclass."""
    return _loader(partition, where).Meta.from_json(partition.meta, where=where,
                                                    partition=partition.name)


def create_executor(partition: Partition, files_dir: Path, *, where: str,
                    entries: set[str] | None = None, **options: Any) -> Executor:
    """``entries``: the verified entry names; the meta's file keys (``Entry`` fields,
    opened as files) must name one of them (runtime/consistency.py)."""
    loader = _loader(partition, where)
    meta = loader.Meta.from_json(partition.meta, where=where, partition=partition.name)
    if entries is not None:
        check_partition_files(partition, meta.files(), entries, where=where)
    try:
        return loader.load(partition, meta, files_dir, where=where, **options)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        # The meta is checked above; what is left is a record inside a file the meta
        # names (a weights index, say) that does not fit: a malformed manifest, said so.
        raise ArtifactError(
            f"partition '{partition.name}' ({partition.backend}) has a malformed manifest "
            f"record ({type(exc).__name__}: {str(exc)[:200]})", where=where,
            hint="rebuild the artifact with `exporter build`; --debug shows where") from exc


def _loader(partition: Partition, where: str) -> ExecutorKind:
    kind = partition.backend
    with _LOCK:
        loader = _KINDS.get(kind)
        if loader is None:
            raise CompatibilityError(
                f"partition '{partition.name}' needs backend '{kind}', which this runtime "
                f"does not have (it has: {', '.join(sorted(_KINDS))})", where=where,
                hint="upgrade the runtime to the toolchain version that built the artifact")
        if isinstance(loader, str):
            loader = _KINDS[kind] = _resolve(kind, loader, partition, where)
    return loader


def _resolve(kind: str, spec: str, partition: Partition, where: str) -> ExecutorKind:
    module_name, _, attribute = spec.partition(":")
    try:
        loader: Any = importlib.import_module(module_name.strip())
        for part in filter(None, attribute.strip().split(".")):
            loader = getattr(loader, part)
    except (ImportError, AttributeError) as exc:
        raise CompatibilityError(
            f"partition '{partition.name}' needs backend '{kind}', whose executor {spec!r} "
            f"cannot be imported ({type(exc).__name__}: {exc})", where=where,
            hint="reinstall the package that provides this backend") from exc
    _check_loader(kind, loader)
    return loader


def _check_loader(kind: str, loader: Any) -> None:
    """A loader without a Meta dataclass or a load function is a bug: said at its first
    use, not as a confusing failure inside an artifact."""
    meta = getattr(loader, "Meta", None)
    if not (inspect.isclass(meta) and issubclass(meta, PartitionMeta)):
        raise TypeError(f"executor kind '{kind}': {loader!r} has no Meta (a PartitionMeta "
                        "dataclass subclass)")
    if not callable(getattr(loader, "load", None)):
        raise TypeError(f"executor kind '{kind}': {loader!r} has no load() function")
    meta.check_schema()
