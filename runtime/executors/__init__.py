"""One executor per backend kind: partition files + device -> callable on tensors.

Kinds live in a registry: the built-in five, those registered with ``register_executor``,
and plug-ins installed as packages that declare an entry point in the group
``edge_exporter.executors`` (name: the kind; value: ``module:ExecutorClass`` or a module
with ``Meta`` and ``load``; see runtime/executors/base.py). Everything is imported lazily:
a device needs only the packages of the backends its artifacts use (onnxruntime and tvm
are optional), and installed plug-ins are looked up only when a partition names a kind
this runtime does not know.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
import threading
import types
from pathlib import Path
from typing import Any

from runtime.errors import ArtifactError, CompatibilityError
from runtime.executors.base import Executor, ExecutorKind
from runtime.executors.meta import PartitionMeta
from runtime.format.consistency import check_partition_files
from runtime.format.manifest import Partition

__all__ = ["ENTRY_POINT_GROUP", "Executor", "ExecutorKind", "PartitionMeta", "array_packages",
           "create_executor", "holds_native_code", "kinds", "parse_meta", "register_executor", "unregister_executor"]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "edge_exporter.executors"

_BUILTIN = {
    "aoti": "runtime.executors.aoti:AotiExecutor",
    "executorch": "runtime.executors.executorch:ExecutorchExecutor",
    "onnxruntime": "runtime.executors.onnxruntime:OnnxRuntimeExecutor",
    "torch": "runtime.executors.torch_fallback:TorchFallbackExecutor",
    "tvm": "runtime.executors.tvm:TvmExecutor",
}
# What the built-in kinds on torch declare (arrays, array_packages, portable), answered
# without importing their modules, which import torch: `exporter inspect` asks it.
# tests/runtime/test_executor_registry.py checks it against the classes.
_TORCH_KINDS = {"aoti": (False, (), False), "torch": (False, (), True)}
# kind -> its loader, or "module:attribute" / "module" until first used
_KINDS: dict[str, ExecutorKind | str] = dict(_BUILTIN)
# Two threads loading artifacts may resolve a kind at once; reentrant, since a plug-in's
# module may call register_executor while the registry imports it.
_LOCK = threading.RLock()


def register_executor(kind: str, loader: ExecutorKind | types.ModuleType | str, *,
                      replace: bool = False) -> None:
    """Make ``kind`` (the manifest's ``partition.backend``) loadable by ``loader``: a class
    or module with ``Meta`` (a PartitionMeta dataclass) and ``load`` (base.ExecutorKind),
    or the ``"module:attribute"`` string of one, imported at its first partition. A kind
    already known is refused unless ``replace``: a plug-in cannot take over a built-in
    kind by accident."""
    if not isinstance(kind, str) or not kind or len(kind) > 100:
        raise ValueError(f"an executor kind is a non-empty name, not {kind!r:.40}")
    if not isinstance(loader, str):
        _check_loader(kind, loader)
    with _LOCK:
        if kind in _KINDS and not replace:
            raise ValueError(f"executor kind '{kind}' is already registered "
                             "(pass replace=True to take it over)")
        _KINDS[kind] = loader


def unregister_executor(kind: str) -> None:
    """Forget a plug-in kind (tests register theirs for a while); built-ins stay."""
    with _LOCK:
        if kind not in _BUILTIN:
            _KINDS.pop(kind, None)


def kinds() -> list[str]:
    """The kinds registered so far (installed plug-ins not yet used are not listed)."""
    return sorted(_KINDS)


def array_packages(partition: Partition) -> tuple[str, ...] | None:
    """What the partition's kind imports beyond numpy when it runs on numpy arrays, as its
    executor declares (``arrays = True``, ``array_packages``); None when it runs on torch
    tensors, or cannot be imported here (a kind whose module needs torch, where torch is
    missing: it needs torch; an unknown kind: ``create_executor`` says so)."""
    arrays, packages, _ = _declared(partition)
    return packages if arrays else None


def holds_native_code(partition: Partition) -> bool:
    """Whether the partition's files hold code compiled for one platform, so the loader
    checks the artifact's platform and CPU: true unless its kind declares ``portable =
    True`` (a kind that cannot be imported here counts as native, the safe side) and does
    not say, by its optional ``native_code(meta)``, that this partition carries some (the
    onnx target's kernel library beside its graph)."""
    if not _declared(partition)[2]:
        return True
    if partition.backend in _TORCH_KINDS:
        return False
    says = getattr(_loader(partition, where=""), "native_code", None)
    return bool(says and says(partition.meta))


def _declared(partition: Partition) -> tuple[bool, tuple[str, ...], bool]:
    """(arrays, array_packages, portable) as the partition's kind declares them; a kind
    that cannot be imported here runs on torch and counts as native."""
    if partition.backend in _TORCH_KINDS and _KINDS.get(partition.backend) == _BUILTIN.get(
            partition.backend):  # the built-in, not a replacement registered since
        return _TORCH_KINDS[partition.backend]
    try:
        loader = _loader(partition, where="")
    except CompatibilityError:
        return False, (), False
    return (bool(getattr(loader, "arrays", False)), tuple(getattr(loader, "array_packages", ())),
            bool(getattr(loader, "portable", False)))


def parse_meta(partition: Partition, *, where: str) -> PartitionMeta:
    """``partition.meta`` checked by its kind's Meta dataclass."""
    return _loader(partition, where).Meta.from_json(partition.meta, where=where,
                                                    partition=partition.name)


def create_executor(partition: Partition, files_dir: Path, *, where: str,
                    entries: set[str] | None = None, **options: Any) -> Executor:
    """``entries``: the verified entry names; the meta's file keys (``Entry`` fields,
    opened as files) must name one of them (runtime/format/consistency.py)."""
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
            loader = _KINDS[kind] = _installed_plugin(partition, where)
        if isinstance(loader, str):
            loader = _KINDS[kind] = _resolve(kind, loader, partition, where)
    return loader


def _installed_plugin(partition: Partition, where: str) -> str:
    """The entry point's "module:attribute" for an unknown kind, else CompatibilityError."""
    found = {ep.name: f"{ep.module}:{ep.attr}" if ep.attr else ep.module
             for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    if partition.backend in found:
        log.info("backend '%s' comes from the installed plug-in %s", partition.backend,
                 found[partition.backend])
        return found[partition.backend]
    raise CompatibilityError(
        f"partition '{partition.name}' needs backend '{partition.backend}', which this "
        f"runtime does not have (it has: {', '.join(sorted(set(_KINDS) | set(found)))})",
        where=where, hint="upgrade the runtime to the toolchain version that built the "
                          "artifact, or install the package that provides this backend")


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
    """A loader without a Meta dataclass or a load function is the plug-in's bug: said
    at registration (or first use), not as a confusing failure inside an artifact."""
    meta = getattr(loader, "Meta", None)
    if not (inspect.isclass(meta) and issubclass(meta, PartitionMeta)):
        raise TypeError(f"executor kind '{kind}': {loader!r} has no Meta (a PartitionMeta "
                        "dataclass subclass)")
    if not callable(getattr(loader, "load", None)):
        raise TypeError(f"executor kind '{kind}': {loader!r} has no load() function")
    meta.check_schema()
