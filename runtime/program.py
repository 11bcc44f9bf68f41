"""``Program``: a loaded artifact. It checks inputs and runs the partitions in order.

Executors (one per backend kind) only turn tensors into tensors; scheduling,
input checks and the hand-off of tensors between partitions live here.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch
from torch.utils._pytree import tree_leaves

from runtime.errors import InputMismatchError
from runtime.manifest import Manifest, TensorSpec
from runtime.outputs import decode_tree

Executor = Callable[[list[torch.Tensor]], list[torch.Tensor]]


class Program:
    def __init__(self, manifest: Manifest, executors: Sequence[Executor], *, source: str) -> None:
        self.manifest = manifest
        self.source = source
        self._executors = list(executors)

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.manifest.signature.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.manifest.signature.outputs]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call like the original model; tensors are taken from args/kwargs in pytree order,
        and the outputs come back in the model's structure (dicts, tuples, lists)."""
        flat = [leaf for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
        outputs = self.run(flat)
        return decode_tree(self.manifest.signature.output_tree, list(outputs.values()))

    def run(self, inputs: Mapping[str, torch.Tensor] | Sequence[torch.Tensor], *,
            output_device: str | torch.device | None = None) -> dict[str, torch.Tensor]:
        """Run on named or positional inputs; returns outputs by name.

        Outputs land on ``output_device``, by default the device of the first input."""
        tensors = self._order_inputs(inputs)
        check_inputs(self.manifest.signature.inputs, tensors, where=self.source)
        if output_device is None:
            output_device = tensors[0].device if tensors else "cpu"
        values: dict[str, torch.Tensor] = dict(zip(self.input_names, tensors))
        for partition, execute in zip(self.manifest.partitions, self._executors):
            args = [values[name].to(partition.device) for name in partition.inputs]
            values.update(zip(partition.outputs, execute(args)))
        return {name: values[name].to(output_device) for name in self.output_names}

    def _order_inputs(self, inputs: Mapping[str, torch.Tensor] | Sequence[torch.Tensor]
                      ) -> list[torch.Tensor]:
        names = self.input_names
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


def check_inputs(specs: Sequence[TensorSpec], tensors: Sequence[Any], *, where: str) -> None:
    """Raise one InputMismatchError listing every input that does not fit its spec."""
    problems: list[str] = []
    symbols: dict[str, tuple[int, str]] = {}  # symbol -> (value, first input that set it)
    for spec, tensor in zip(specs, tensors):
        if not isinstance(tensor, torch.Tensor):
            problems.append(f"input '{spec.name}': expected a tensor, got {type(tensor).__name__}")
            continue
        problems += _check_one(spec, tensor, symbols)
    if problems:
        raise InputMismatchError(
            f"{len(problems)} problem(s) with the inputs", where=where, details=problems,
            hint="the artifact expects " + "; ".join(s.describe() for s in specs))


def _check_one(spec: TensorSpec, tensor: torch.Tensor, symbols: dict) -> list[str]:
    problems = []
    got_dtype = str(tensor.dtype).removeprefix("torch.")
    if got_dtype != spec.dtype:
        problems.append(f"input '{spec.name}': expected dtype {spec.dtype}, got {got_dtype}")
    if tensor.device.type not in ("cpu", "cuda"):
        problems.append(f"input '{spec.name}': tensors on device '{tensor.device}' are not "
                        "supported (give cpu or cuda tensors)")
    if tensor.dim() != len(spec.shape):
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
