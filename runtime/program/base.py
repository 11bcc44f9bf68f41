"""What every loaded program has, whatever its tensors are: the manifest, the executors in
run order, the names, the backends' reports, input ordering and the signature checks.

Torch-free: ``Program`` (runtime/program/torch_program.py, torch tensors) and ``ArrayProgram``
(runtime/program/array_program.py, numpy arrays on a device without torch) build on it.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from runtime.errors import InputMismatchError
from runtime.executors.base import Executor
from runtime.format.dtypes import name_of
from runtime.format.manifest import Manifest, TensorSpec


class ProgramBase:
    def __init__(self, manifest: Manifest, executors: Sequence[Executor], *,
                 source: str) -> None:
        self.manifest = manifest
        self.source = source
        self._executors = list(executors)
        self._arenas: dict = {}  # per device, the build's memory plan (runtime/memory/arena.py)
        self._input_names = self.input_names
        self._output_names = self.output_names

    def __repr__(self) -> str:
        """One line: where it came from, what to call it with, what it returns, and which
        backends run its partitions."""
        signature = self.manifest.signature
        backends: dict[str, int] = {}
        for partition in self.manifest.partitions:
            key = f"{partition.backend}@{partition.device}"
            backends[key] = backends.get(key, 0) + 1
        return (f"<{type(self).__name__} {self.source!r} target={self.manifest.target} "
                f"inputs=[{', '.join(s.describe() for s in signature.inputs)}] "
                f"outputs=[{', '.join(s.describe() for s in signature.outputs)}] "
                f"partitions=[{', '.join(f'{k} x{n}' for k, n in backends.items())}]>")

    @property
    def executors(self) -> list[Executor]:
        """One executor per partition, in run order (read-only view)."""
        return list(self._executors)

    @property
    def backend_reports(self) -> dict[str, dict]:
        """What each partition's backend said at load (e.g. ONNX Runtime's providers and
        node placement), by partition name: CPU fallback inside a backend is never silent.
        Backends with nothing to say are left out; every report has a ``placement`` (None
        where the backend cannot say), which `exporter run` prints."""
        reports = {}
        for partition, execute in zip(self.manifest.partitions, self._executors):
            report = execute.report()
            if report:
                reports[partition.name] = dict(report, placement=report.get("placement"))
        return reports

    @property
    def memory_report(self) -> dict[str, dict]:
        """Per device: the arena's bytes and how many planned tensors live there (hand-off
        copies, and CPU-fallback intermediates that run in it)."""
        slots = sum(execute.arena_slots for execute in self._executors)
        return {device: {"arena_bytes": arena.nbytes, "planned": len(arena.slots),
                         "handoffs": sum(key.startswith("handoff/") for key in arena.slots),
                         "fallback_slots_in_use": slots if device == "cpu" else 0}
                for device, arena in self._arenas.items()}

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.manifest.signature.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.manifest.signature.outputs]

    def _order_inputs(self, inputs: Mapping[str, Any] | Sequence[Any]) -> list[Any]:
        names = self._input_names
        if type(inputs) in (list, tuple) and len(inputs) == len(names):
            return inputs
        if isinstance(inputs, Mapping):
            missing = [n for n in names if n not in inputs]
            unexpected = sorted(set(inputs) - set(names))
            if missing or unexpected:
                details = [f"missing input '{n}'" for n in missing]
                details += [f"unexpected input '{n}'" for n in unexpected]
                raise InputMismatchError(
                    "the inputs given do not match the artifact's input names", where=self.source,
                    details=details, hint=f"give exactly these inputs: {', '.join(names)}")
            return [inputs[n] for n in names]
        tensors = list(inputs)
        if len(tensors) != len(names):
            raise InputMismatchError(
                f"the artifact takes {len(names)} input tensor(s) and {len(tensors)} were given",
                where=self.source, details=[spec.describe() for spec in self.manifest.signature.inputs],
                hint="pass one tensor per input, in this order")
        return tensors


def shape_rules(specs: Sequence[TensorSpec]) -> list[tuple[int, list[tuple]]]:
    """Per input: its rank and (axis, size, symbol, min, max) per dim, for ``shapes_fit``."""
    return [(len(spec.shape), [(axis, d.size, d.symbol, d.min, d.max)
                               for axis, d in enumerate(spec.shape)]) for spec in specs]


def shapes_fit(rules: list[tuple[int, list[tuple]]], shapes: list) -> bool:
    """Whether the inputs' shapes fit the signature: static dims equal, dynamic ones within
    their bounds, and one value per symbol. (The hot path's check; ``check_inputs`` says
    what is wrong.)"""
    symbols: dict[str, int] = {}
    for (rank, dims), shape in zip(rules, shapes):
        if len(shape) != rank:
            return False
        for axis, size, symbol, low, high in dims:
            got = shape[axis]
            if size is not None:
                if got != size:
                    return False
            elif not low <= got <= high or symbols.setdefault(symbol, got) != got:
                return False
    return True


def check_inputs(specs: Sequence[TensorSpec], tensors: Sequence[Any], *, where: str) -> None:
    """Raise one InputMismatchError listing every input that does not fit its spec. The
    inputs are torch tensors or numpy arrays (anything with a dtype and a shape)."""
    problems: list[str] = []
    symbols: dict[str, tuple[int, str]] = {}  # symbol -> (value, first input that set it)
    for spec, tensor in zip(specs, tensors):
        if not (hasattr(tensor, "dtype") and hasattr(tensor, "shape")):
            problems.append(f"input '{spec.name}': expected a tensor, got {type(tensor).__name__}")
            continue
        problems += _check_one(spec, tensor, symbols)
    if problems:
        raise InputMismatchError(
            f"{len(problems)} problem(s) with the inputs", where=where, details=problems,
            hint="the artifact expects " + "; ".join(s.describe() for s in specs)
            + _padding_hint(specs, tensors))


def _padding_hint(specs: Sequence[TensorSpec], tensors: Sequence[Any]) -> str:
    """A text shorter than a dynamic length's minimum fits once padded, masked out."""
    masks = {d.symbol for s in specs if s.name == "attention_mask" for d in s.shape
             if d.is_dynamic}
    for spec, tensor in zip(specs, tensors):
        for dim, got in zip(spec.shape, getattr(tensor, "shape", ())):
            if dim.is_dynamic and dim.symbol in masks and got < dim.min:
                return (f"; a text shorter than {dim.min} tokens fits padded to {dim.min} "
                        "(the tokenizer's pad id), with attention_mask 0 on the padding")
    return ""


def _check_one(spec: TensorSpec, tensor: Any, symbols: dict) -> list[str]:
    problems = []
    got_dtype = name_of(tensor)
    if got_dtype != spec.dtype:
        problems.append(f"input '{spec.name}': expected dtype {spec.dtype}, got {got_dtype}")
    device = getattr(tensor, "device", "cpu")  # numpy 2 says "cpu"; numpy 1 has none
    device = getattr(device, "type", device)
    if device not in ("cpu", "cuda"):
        problems.append(f"input '{spec.name}': tensors on device '{tensor.device}' are not "
                        "supported (give cpu or cuda tensors)")
    if len(tensor.shape) != len(spec.shape):
        return problems + [f"input '{spec.name}': expected rank {len(spec.shape)} "
                           f"({spec.describe()}), got shape {tuple(tensor.shape)}"]
    for axis, (dim, got) in enumerate(zip(spec.shape, tensor.shape)):
        if not dim.is_dynamic:
            if got != dim.size:
                problems.append(f"input '{spec.name}' dim {axis}: expected {dim.size}, got {got}")
            continue
        if not dim.min <= got <= dim.max:
            problems.append(f"input '{spec.name}' dim {axis} ({dim.symbol}): {got} is outside "
                            f"the built range {dim.min}..{dim.max}")
        seen = symbols.setdefault(dim.symbol, (got, spec.name))
        if seen[0] != got:
            problems.append(f"input '{spec.name}' dim {axis} ({dim.symbol}) is {got} but input "
                            f"'{seen[1]}' has {dim.symbol}={seen[0]}; they must be equal")
    return problems
