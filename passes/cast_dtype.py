"""Run a program's floating-point math in fp16 or bf16, keeping the caller's I/O dtypes.

A pass on the exported program, not autocast at run time: weights are cast once,
float inputs are cast on entry and float outputs cast back on exit, and the
program is re-captured so every node's metadata carries the new dtype. The
semantics are those of ``model.half()`` in eager (explicit ``dtype=float32``
upcasts inside the model stay, as they do there).

    before: linear(x: f32, w: f32) -> f32
    after:  linear(to(x, f16), w: f16) -> to(.., f32)
"""

from __future__ import annotations

import copy

import torch
from torch.export import ExportedProgram
from torch.utils._pytree import tree_map, tree_map_only

from passes.base import PassResult
from passes.dims import dynamic_shapes_for
from runtime.flat_inputs import FlatInputs, flatten_inputs

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class _CastIO(torch.nn.Module):
    """Flat tensors in (cast to ``dtype``), the module's outputs out (cast back)."""

    def __init__(self, inner: torch.nn.Module, dtype: torch.dtype, inputs: FlatInputs) -> None:
        super().__init__()
        self.inner, self.dtype, self.inputs = inner, dtype, inputs

    def forward(self, *flat: torch.Tensor):
        cast = [t.to(self.dtype) if t.is_floating_point() else t for t in flat]
        args, kwargs = self.inputs.rebuild(cast)
        out = self.inner(*args, **kwargs)
        # Float outputs go back to float32, the dtype the caller's inputs had.
        return tree_map_only(torch.Tensor,
                             lambda t: t.float() if t.is_floating_point() else t, out)


class CastFloatDtype:
    name = "cast_dtype"

    def __init__(self, dtype: str) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"CastFloatDtype takes one of {sorted(DTYPES)}, not {dtype!r}")
        self.dtype_name, self.dtype = dtype, DTYPES[dtype]

    def __call__(self, program: ExportedProgram) -> PassResult:
        # A copy: program.module() shares its Parameter objects with the user's model,
        # and Module.to() would convert those in place.
        module = copy.deepcopy(program.module())
        if not any(t.dtype == torch.float32 for t in [*module.parameters(), *module.buffers()]):
            # Nothing left in float32: already cast (or nothing to cast).
            return PassResult(program, modified=False, info={"dtype": self.dtype_name})
        before = _float_bytes(module)
        retyped = self._retype_float32_literals(module)
        module = module.to(self.dtype)
        inputs = flatten_inputs(*program.example_inputs)
        wrapped = _CastIO(module, self.dtype, inputs)
        user_inputs = [n for n in program.graph.nodes if n.op == "placeholder"
                       and n.name in program.graph_signature.user_inputs]
        recaptured = torch.export.export(wrapped, tuple(inputs.tensors),
                                         dynamic_shapes=(dynamic_shapes_for(user_inputs,
                                                                            program),),
                                         strict=False)
        info = {"dtype": self.dtype_name, "nodes_retyped": retyped,
                "float_weight_bytes_before": before,
                "float_weight_bytes_after": _float_bytes(module)}
        return PassResult(recaptured, modified=True, info=info)


    def _retype_float32_literals(self, module: torch.fx.GraphModule) -> int:
        """``dtype=float32`` written into the graph (masks built with ``.float()``,
        ``torch.full(..., dtype=float32)``) would mix dtypes and promote the math back
        to float32, or fail in matmul; like ONNX's float16 converters, retype them all."""
        count = 0

        def swap(value):
            nonlocal count
            if value is torch.float32:
                count += 1
                return self.dtype
            return value

        for node in module.graph.nodes:
            node.args = tree_map(swap, node.args)
            node.kwargs = tree_map(swap, node.kwargs)
        module.recompile()
        return count


def _float_bytes(module: torch.nn.Module) -> int:
    tensors = list(module.parameters()) + list(module.buffers())
    return sum(t.numel() * t.element_size() for t in tensors if t.is_floating_point())
