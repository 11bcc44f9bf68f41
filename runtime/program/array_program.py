"""``ArrayProgram``: a loaded artifact on a device without torch, numpy arrays in and out.

``runtime.load`` gives one when torch is not installed and every partition runs on the
CPU on ONNX Runtime or TVM (runtime/program/requires.py), whose executors then take and give
arrays. Everything is on the CPU and nothing needs the build's memory plan (its arenas
serve hand-offs between devices and the torch CPU fallback), so running is the
partitions in order, each fed the values it names.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from runtime.errors import UserInputError
from runtime.executors.base import Executor
from runtime.format.dtypes import numpy_dtype
from runtime.format.manifest import Manifest, TensorSpec
from runtime.program.base import ProgramBase, check_inputs, shape_rules, shapes_fit
from runtime.program.outputs import decode_tree

__all__ = ["ArrayProgram"]


class ArrayProgram(ProgramBase):
    def __init__(self, manifest: Manifest, executors: Sequence[Executor], *,
                 source: str) -> None:
        super().__init__(manifest, executors, source=source)
        self._fits = _ArrayCheck(manifest.signature.inputs).check
        calls = [execute.__call__ for execute in self._executors]  # resolved once
        self._steps = [(call, p.inputs, p.outputs) for p, call in zip(manifest.partitions, calls)]
        only = manifest.partitions[0] if len(manifest.partitions) == 1 else None
        # One partition that takes the program's inputs and gives its outputs, in order.
        self._single = calls[0] if (only is not None and list(only.inputs) == self._input_names
                                    and list(only.outputs) == self._output_names) else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call like the original model; arrays are taken from args/kwargs in the order
        torch's pytree flattens them, and the outputs come back in the model's structure."""
        arrays = [leaf for leaf in _leaves((args, kwargs)) if isinstance(leaf, np.ndarray)]
        outputs = self.run(arrays)
        return decode_tree(self.manifest.signature.output_tree, list(outputs.values()))

    def run(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray], *,
            output_device: str | None = None) -> dict[str, np.ndarray]:
        """Run on named or positional arrays; returns arrays by name (on the CPU)."""
        if output_device not in (None, "cpu"):
            raise UserInputError(f"output_device {output_device!r}: without torch, outputs "
                                 "are numpy arrays on the CPU", where=self.source,
                                 hint="leave output_device out, or install torch")
        arrays = self._order_inputs(inputs)
        if not self._fits(arrays):
            check_inputs(self.manifest.signature.inputs, arrays, where=self.source)
        if self._single is not None:
            return dict(zip(self._output_names, self._single(arrays)))
        values = dict(zip(self._input_names, arrays))
        for execute, input_names, output_names in self._steps:
            values.update(zip(output_names, execute([values[name] for name in input_names])))
        return {name: values[name] for name in self._output_names}


class _ArrayCheck:
    """The signature check per call, with the memo of the shapes that passed last time
    (as Program's _FastCheck); False sends the call to check_inputs, which says why."""

    def __init__(self, specs: Sequence[TensorSpec]) -> None:
        self.rules = shape_rules(specs)
        self.dtypes = [numpy_dtype(spec.dtype) for spec in specs]
        self.passed: list | None = None

    def check(self, arrays: Sequence[Any]) -> bool:
        if len(arrays) != len(self.dtypes):
            return False
        try:
            if not all(a.dtype == d and type(a) is np.ndarray
                       for a, d in zip(arrays, self.dtypes)):
                return False
            shapes = [a.shape for a in arrays]
        except AttributeError:
            return False
        if shapes != self.passed:
            if not shapes_fit(self.rules, shapes):
                return False
            self.passed = shapes
        return True


def _leaves(tree: Any) -> list[Any]:
    """The leaves of nested tuples, lists and dicts (values in insertion order), as torch's
    pytree orders them (tests/runtime/test_device_numpy.py checks they agree). Written here: the
    device has no torch, and these containers are all a call passes arrays in."""
    if isinstance(tree, (tuple, list)):
        return [leaf for item in tree for leaf in _leaves(item)]
    if isinstance(tree, dict):
        return [leaf for item in tree.values() for leaf in _leaves(item)]
    return [tree]
