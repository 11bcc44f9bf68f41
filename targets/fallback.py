"""Lowering for the CPU-fallback backend ("torch"): what no target claims runs in plain PyTorch.

The artifact must carry such a partition without pickle, so the graph goes out as
torch's own export JSON (torch._export.serde, the JSON part only) and the weights
as safetensors. runtime.executors.torch_fallback reads both back.

Files (names relative to the partition folder; the build stores them as
``partitions/<name>/<file>`` and rewrites the meta values to those entry names):

* ``program.json``: graph, signature, range constraints (meta["program"]);
* ``weights.safetensors``: keys ``param/<name>``, ``buffer/<name>``,
  ``constant/<name>`` so the loader knows which dict each tensor goes to
  (meta["weights"]); with shared weights (a generating build) the same keys name
  tensors of the artifact's shared store instead (meta["shared_weights"]).
"""

from __future__ import annotations

import inspect
import json
import platform
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.errors import ToolchainError

if TYPE_CHECKING:  # imported where a partition is lowered: `exporter inspect` reads the name
    import torch
    from torch.export import ExportedProgram

    from targets.base import Lowered

FALLBACK_BACKEND = "torch"
PROGRAM_FILE = "program.json"
WEIGHTS_FILE = "weights.safetensors"

_HINT = ("keep this op out of the partition (rewrite the model without it), or register a "
         "target that supports it")


class FallbackSerializationError(ToolchainError):
    """A partition cannot be written as export JSON + safetensors (exit code 3)."""


def lower_fallback(program: ExportedProgram, work_dir: Path, *, shared: bool = False) -> Lowered:
    """``shared`` (``LowerOptions.shared_weights``, a generating build): the tensors go back
    in ``Lowered.weights`` for the artifact's one store instead of the partition's own
    file, so an MoE's experts on the fallback of both entry points are stored once."""
    import torch

    from runtime.executors.torch_fallback import WEIGHTS_KEY, TorchFallbackMeta
    from runtime.format.manifest import Requirements
    from runtime.format.weights import read_index
    from targets.base import Lowered

    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    tensors = _weights(program)  # first: it names unsupported weights better than serde does
    program_bytes = _serialize_graph(program)
    schema = json.loads(program_bytes)["schema_version"]

    program_path, weights_path = work_dir / PROGRAM_FILE, work_dir / WEIGHTS_FILE
    program_path.write_bytes(program_bytes)
    files = {PROGRAM_FILE: program_path}
    if not shared:
        _save_weights(tensors, weights_path)
        files[WEIGHTS_FILE] = weights_path
    meta = TorchFallbackMeta(
        program=PROGRAM_FILE, weights=None if shared else WEIGHTS_FILE,
        schema_version=f"{schema['major']}.{schema['minor']}",
        tensor_index=None if shared else {WEIGHTS_KEY: read_index(weights_path)},
        weights_count=len(tensors),
        weights_bytes=sum(t.numel() * t.element_size() for t in tensors.values()))
    return Lowered(files=files, meta=meta.to_json(), weights=tensors if shared else {},
                   requirements=Requirements(arch=platform.machine(), torch=torch.__version__))


def _serialize_graph(program: ExportedProgram) -> bytes:
    from torch._export.serde.serialize import serialize

    # Weights and example inputs would be pickled into bytes we throw away; skip
    # them where this torch lets us (the flags are not in every 2.x release).
    flags = inspect.signature(serialize).parameters
    kwargs = {name: False for name in
              ("serialize_state_dict", "serialize_constants", "serialize_example_inputs")
              if name in flags}
    try:
        return serialize(program, **kwargs).exported_program
    except Exception as exc:  # serde and its verifier raise many types; name the culprit ops
        raise FallbackSerializationError(
            f"torch's export serializer cannot write this fallback partition "
            f"({type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]})",
            where="CPU-fallback partition", details=_suspect_nodes(program), hint=_HINT) from exc


def _suspect_nodes(program: ExportedProgram) -> list[str]:
    """Call nodes whose target is not an operator the export schema can name."""
    import torch
    allowed = (torch._ops.OpOverload, torch._ops.HigherOrderOperator)
    found = []
    for node in program.graph.nodes:
        target = node.target
        if node.op != "call_function" or isinstance(target, allowed):
            continue
        if getattr(target, "__module__", None) in ("_operator", "operator", "math", "builtins"):
            continue  # symbolic-shape arithmetic: serializable by name
        trace = (node.meta.get("stack_trace") or "").strip().splitlines()
        found.append(f"op {getattr(target, '__qualname__', target)!s} (node '{node.name}')"
                     + (f" at {trace[-2].strip()}" if len(trace) >= 2 else ""))
    return found


def _weights(program: ExportedProgram) -> dict[str, torch.Tensor]:
    """Every tensor the graph reads, keyed ``<kind>/<name>`` (see the module docstring)."""
    import torch
    from torch.export.graph_signature import InputKind

    from runtime.executors.torch_fallback import BUFFER, CONSTANT, PARAM
    tensors: dict[str, torch.Tensor] = {}
    rejected: list[str] = []
    for spec in program.graph_signature.input_specs:
        name = spec.target
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER) and name in program.state_dict:
            value = program.state_dict[name]
            prefix = PARAM if isinstance(value, torch.nn.Parameter) else BUFFER
        elif spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
            value, prefix = program.constants.get(name), CONSTANT  # non-persistent buffers too
        else:
            continue  # user inputs and tokens: not weights
        if type(value) not in (torch.Tensor, torch.nn.Parameter) or value.is_quantized:
            rejected.append(f"'{name}' is a {type(value).__name__}, not a plain tensor")
            continue
        # A fresh contiguous copy per name: safetensors refuses views and shared storage.
        tensors[prefix + name] = value.detach().to("cpu").clone(
            memory_format=torch.contiguous_format)
    if rejected:
        raise FallbackSerializationError(
            "the fallback partition holds weights that safetensors cannot store",
            where="CPU-fallback partition", details=rejected,
            hint="torchbind objects, quantized tensors and tensor subclasses cannot run on the "
                 "CPU fallback; keep them in a delegated partition")
    return tensors


def _save_weights(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file
    try:
        save_file(tensors, str(path), metadata={"format": "pt"})
    except (ValueError, TypeError) as exc:  # e.g. a dtype safetensors lacks
        raise FallbackSerializationError(
            f"safetensors cannot store the fallback weights ({exc})",
            where=str(path), hint="cast the model to a standard dtype before the build") from exc
