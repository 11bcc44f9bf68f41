"""CPU-fallback executor ("torch" backend): runs a partition with plain PyTorch.

The partition folder holds two files, and no pickle:

* ``meta["program"]``: the ExportedProgram's graph and signature as torch's own
  export JSON (torch._export.serde), without weights or example inputs;
* ``meta["weights"]``: every tensor the graph reads, as safetensors. Each key is
  ``<kind>/<name>``: kind ``param`` and ``buffer`` go to the program's state_dict
  (params as nn.Parameter, which torch's verifier insists on), ``constant`` to its
  constants (non-persistent buffers and lifted tensor constants).

Like the AOTI executor's ``meta["package"]``, the meta values are paths relative to
``files_dir``: the build rewrites them to full entry names
(``partitions/<name>/program.json``); the lowering writes bare file names.
``TorchFallbackMeta`` declares every key.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_unflatten

from runtime.errors import ArtifactError, CompatibilityError, ExecutionError
from runtime.executors.custom_ops import register_known
from runtime.executors.meta import Entry, PartitionMeta
from runtime.format.manifest import Partition
from runtime.format.weights import load_checked
from runtime.memory.arena import Arena, run_in_arena
from runtime.memory.shared_weights import SharedWeights, missing_store

# TorchFallbackMeta's file keys by name, for the lowering's index (tensor_index[WEIGHTS_KEY])
PROGRAM_KEY = "program"
WEIGHTS_KEY = "weights"
# Prefixes of the safetensors keys; shared with the lowering, so both sides agree.
PARAM, BUFFER, CONSTANT = "param/", "buffer/", "constant/"

_REBUILD = "rebuild the artifact with `exporter build`"


@dataclass(frozen=True)
class TorchFallbackMeta(PartitionMeta):
    program: Entry  # the graph as torch's export JSON
    # every tensor it reads, as safetensors; None where they are in the shared store
    weights: Entry | None = None
    schema_version: str | None = None  # torch's export schema, "major.minor" (report)
    # runtime.format.weights.INDEX_KEY: {"weights": the weights file's index}, checked
    # before reading
    tensor_index: dict[str, dict] | None = None
    weights_count: int | None = None  # report
    weights_bytes: int | None = None  # report
    # Custom ops the graph calls ("namespace.op"): the build adds these, so that the code
    # registering them can be imported before loading (runtime.__main__'s preload).
    custom_ops: tuple[str, ...] | None = None
    # the installed module that registers each of them, where the build knew it
    # (transformers.integrations.moe for Mixtral's grouped_mm_fallback): named in the hint
    custom_op_modules: dict[str, str] | None = None


class TorchFallbackExecutor:
    Meta = TorchFallbackMeta
    portable = True  # torch's export JSON and safetensors: no native code

    def __init__(self, module, in_spec, slots: list, reset: list, partition: str,
                 where: str) -> None:
        self._module = module
        self._in_spec = in_spec
        self._reset = reset
        # the slots are shared state: one call at a time (without them, calls may overlap)
        self._lock = threading.Lock() if slots else contextlib.nullcontext()
        self._partition = partition
        self._where = where
        self.arena_slots = len(slots)  # what `Program.memory_report` counts

    @classmethod
    def load(cls, partition: Partition, meta: TorchFallbackMeta, files_dir: Path, *,
             where: str, arena: Arena | None = None, shared: SharedWeights | None = None,
             **_: object) -> TorchFallbackExecutor:
        program_path = _entry(partition, files_dir, PROGRAM_KEY, meta.program, where)
        at_program = f"{where}: {meta.program}"
        raw = _read_json(program_path, where=at_program)
        _check_schema(raw, where=at_program)
        _check_ops(raw, where=f"{where}: partition '{partition.name}'",
                   modules=sorted(set((meta.custom_op_modules or {}).values())))
        state_dict, constants = _weights(partition, meta, files_dir, shared, where)
        program = _deserialize(raw, state_dict, constants, where=at_program)
        # module() puts the weights back into the graph (they are lifted inputs in the
        # program) and applies buffer mutations, so it is the one correct way to run it.
        module = program.module()
        # Planned intermediates write into the device arena (runtime/memory/arena.py). With dynamic
        # dims a slot changes shape per call: emptied first, so the out= op resizes it quietly.
        slots = run_in_arena(module, arena, f"{partition.name}/") if arena is not None else []
        return cls(module, program.call_spec.in_spec, slots,
                   slots if has_dynamic_inputs(program) else [], partition.name, where)

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        try:
            args, kwargs = tree_unflatten(list(inputs), self._in_spec)
            with torch.no_grad(), self._lock:
                for slot in self._reset:
                    slot.resize_(0)
                outputs = self._module(*args, **kwargs)
        except Exception as exc:  # kernels and shape guards raise many types; name the partition
            raise ExecutionError(
                f"PyTorch failed running partition '{self._partition}' ({_first_line(exc)})",
                where=self._where, hint="check the inputs against `exporter inspect`") from exc
        return list(tree_leaves(outputs))

    def report(self) -> dict:
        return {}


def has_dynamic_inputs(program) -> bool:
    """Whether any input of ``program`` has a dim of no fixed size (a symbol). Also the
    AOTInductor targets' test for settings that only fixed shapes take."""
    return any(isinstance(size, torch.SymInt) for node in program.graph.find_nodes(op="placeholder")
               if isinstance(node.meta.get("val"), torch.Tensor) for size in node.meta["val"].shape)


def _entry(partition: Partition, files_dir: Path, key: str, name: str, where: str) -> Path:
    if not (files_dir / name).is_file():
        raise ArtifactError(
            f"partition '{partition.name}' has no readable '{key}' file (meta[{key!r}] = {name!r})",
            where=where, hint=_REBUILD)
    return files_dir / name


def _read_json(path: Path, *, where: str) -> dict:
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"the fallback program is not valid JSON ({exc})", where=where,
                            hint=_REBUILD) from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("graph_module"), dict):
        raise ArtifactError("the fallback program is not a serialized ExportedProgram",
                            where=where, hint=_REBUILD)
    return raw


def _check_schema(raw: dict, *, where: str) -> None:
    """torch only reads its own major schema version; say so before it fails deep inside."""
    from torch._export.serde.schema import SCHEMA_VERSION
    version = raw.get("schema_version")
    major = version.get("major") if isinstance(version, dict) else None
    if major != SCHEMA_VERSION[0]:
        raise CompatibilityError(
            f"the fallback program uses export schema {major}.x (written by torch "
            f"{raw.get('torch_version')}); this torch {torch.__version__} reads "
            f"{SCHEMA_VERSION[0]}.x", where=where,
            hint="install the torch version shown by `exporter inspect`")


def _check_ops(raw: dict, *, where: str, modules: list[str] = ()) -> None:
    """List every operator this process lacks at once (torch stops at the first);
    ``modules``: those the build recorded as registering the custom ones."""
    missing = sorted({t for t in _targets(raw) if not _resolves(t)})
    if missing:  # those the runtime has kernels for, it registers (runtime/executors/custom_ops.py)
        register_known({_op_name(t) for t in missing})
        missing = [t for t in missing if not _resolves(t)]
    builtin = [t for t in missing if t.split(".")[2] in _TORCH_NAMESPACES]
    custom = [t for t in missing if t not in builtin]
    if custom:
        names = ", ".join(f"'{_op_name(t)}'" for t in custom)
        raise CompatibilityError(
            f"the partition calls custom op{'s' if len(custom) > 1 else ''} {names}, which "
            f"{'are' if len(custom) > 1 else 'is'} not registered in this process",
            where=where, details=custom,
            hint=(f"load {' and '.join(modules)} first: --preload "
                  f"{' --preload '.join(modules)} (Python: import it before runtime.load)"
                  if modules else "import the library that defines it before runtime.load "
                  "(CLI: --preload FILE.py or MODULE)"))
    if builtin:
        raise CompatibilityError(
            f"the partition calls {len(builtin)} operator(s) this torch {torch.__version__} "
            "does not have", where=where, details=builtin,
            hint="install the torch version shown by `exporter inspect`")


# Namespaces torch itself defines: a miss there means another torch version, not a missing import.
_TORCH_NAMESPACES = {"aten", "prims", "higher_order", "_quantized", "quantized", "profiler"}


def _targets(node: Any):
    """Every ``torch.ops...`` node target, subgraphs of cond/map included."""
    if isinstance(node, dict):
        target = node.get("target")
        if isinstance(target, str) and target.startswith("torch.ops.") and "inputs" in node:
            yield target
        for value in node.values():
            yield from _targets(value)
    elif isinstance(node, list):
        for value in node:
            yield from _targets(value)


def _resolves(target: str) -> bool:
    obj: Any = torch.ops
    try:
        for part in target.split(".")[2:]:
            obj = getattr(obj, part)
    except (AttributeError, RuntimeError):
        return False
    return True


def _op_name(target: str) -> str:
    parts = target.split(".")  # torch.ops.<namespace>.<op>.<overload>
    return f"{parts[2]}::{parts[3]}" if len(parts) >= 4 else target


def _weights(partition: Partition, meta: TorchFallbackMeta, files_dir: Path,
             shared: SharedWeights | None, where: str
             ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(state dict, constants) from the partition's own file or the shared store."""
    if meta.weights is not None:
        path = _entry(partition, files_dir, WEIGHTS_KEY, meta.weights, where)
        index = (meta.tensor_index or {}).get(WEIGHTS_KEY)
        return _split(load_checked(path, index, partition.device,
                                   where=f"{where}: {meta.weights}"), f"{where}: {meta.weights}")
    if not meta.shared_weights:
        return {}, {}
    if shared is None:
        raise missing_store(partition.name, where=where)
    return _split(shared.tensors(meta.shared_weights, partition.device,
                                 partition=partition.name), where)


def _split(tensors: dict[str, torch.Tensor], where: str
           ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    state_dict: dict[str, torch.Tensor] = {}
    constants: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        # safetensors hands back tensors at their file offsets, 8-byte aligned at best;
        # vectorized CPU kernels then take another path (slower, and matmuls differ from
        # eager in the last bit). A copy gets the allocator's 64-byte alignment.
        if tensor.data_ptr() % 64:
            tensor = tensor.clone()
        if key.startswith(PARAM):
            state_dict[key[len(PARAM):]] = torch.nn.Parameter(tensor, requires_grad=False)
        elif key.startswith(BUFFER):
            state_dict[key[len(BUFFER):]] = tensor
        elif key.startswith(CONSTANT):
            constants[key[len(CONSTANT):]] = tensor
        else:
            raise ArtifactError(f"the fallback weights hold an unexpected tensor '{key}'",
                                where=where, hint=_REBUILD)
    return state_dict, constants


def _deserialize(raw: dict, state_dict: dict, constants: dict, *, where: str):
    """torch's JSON -> dataclass -> ExportedProgram, given already-loaded weights.

    Weights go in as dicts and example_inputs as None: the deserializer only calls
    torch.load when handed bytes, so this path never unpickles anything."""
    from torch._export.serde import serialize as serde
    try:
        dataclass = serde._dict_to_dataclass(serde.ExportedProgram, raw)
        return serde.ExportedProgramDeserializer().deserialize(dataclass, state_dict, constants,
                                                               None)
    except Exception as exc:  # a tampered graph fails anywhere inside torch, in many types
        raise ArtifactError(f"torch could not rebuild the fallback program ({_first_line(exc)})",
                            where=where, hint=_REBUILD) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"
