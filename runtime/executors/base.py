"""What Program needs from an executor, and what a backend kind gives the registry.

``Executor``: one loaded partition. ``ExecutorKind``: how a kind loads one (a class or a
module with ``Meta`` and ``load``); ``runtime.executors.register_executor`` takes either.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from runtime.executors.meta import PartitionMeta
from runtime.format.manifest import Partition

if TYPE_CHECKING:  # the runtime imports torch only where a partition needs it
    import torch


@runtime_checkable
class Executor(Protocol):
    """One partition, loaded: tensors in, tensors out (numpy arrays in and out instead, for
    the kinds that declare ``arrays = True`` when loaded with ``arrays=True``: the device
    has no torch).

    Program resolves ``executor.__call__`` once at construction and calls that on every
    run, so a class pays no per-call method lookup (and an executor may hold a plain
    function there: see runtime/executors/onnxruntime.py)."""

    # Planned tensors of the device arena this executor computes in (runtime/memory/arena.py);
    # Program.memory_report counts them. 0 for backends that allocate their own memory.
    arena_slots: int

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The partition's inputs, in manifest order, on its device -> its outputs, in order."""
        ...

    def report(self) -> dict[str, Any]:
        """What the backend said at load, for `exporter run`/`inspect`/`bench` (e.g. ONNX
        Runtime's providers requested, available and used, and under ``"placement"`` which
        provider runs how many nodes); ``{}`` when it has nothing to say. JSON values only."""
        ...


class ExecutorKind(Protocol):
    """A backend kind as the registry sees it: the executor class itself (``Meta`` a
    class attribute, ``load`` a classmethod) or a module defining both.

    Optional: ``arrays = True`` says the kind also runs on numpy arrays, without torch, and
    ``array_packages`` names what it then imports beyond numpy and its backend's library
    (runtime/program/requires.py reads both; without them a kind runs on torch tensors).
    ``portable = True`` says its files hold no native code (an ONNX graph, a .pte), so the
    loader does not check the artifact's platform and CPU for it (runtime/format/
    consistency.py); without it a kind's files are taken as compiled for one platform."""

    Meta: type[PartitionMeta]

    def load(self, partition: Partition, meta: Any, files_dir: Path, *, where: str,
             **options: Any) -> Executor:
        """``meta``: ``Meta.from_json(partition.meta)``, already checked, and its
        ``Entry`` fields already known to name verified entries. ``files_dir``: the
        private copy of the artifact's entries (an entry name is a path under it).
        ``options`` include ``run_single_threaded`` (the partition will be captured in a
        CUDA graph), ``arena`` (the device's runtime.memory.arena.Arena, or None) and, for the
        array kinds only, ``arrays`` (take and give numpy arrays: torch is not installed);
        ignore those you do not use, and accept ones that later runtimes add."""
        ...
