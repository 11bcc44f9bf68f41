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
from torch.export import Dim, ExportedProgram
from torch.utils._pytree import tree_flatten, tree_map, tree_map_only, tree_unflatten

from passes.base import PassResult

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class _CastIO(torch.nn.Module):
    """Flat tensors in (cast to ``dtype``), the module's outputs out (cast back)."""

    def __init__(self, inner: torch.nn.Module, dtype: torch.dtype, leaves: list, spec) -> None:
        super().__init__()
        self.inner, self.dtype, self.leaves, self.spec = inner, dtype, leaves, spec

    def forward(self, *flat: torch.Tensor):
        leaves = list(self.leaves)
        slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        for slot, tensor in zip(slots, flat):
            leaves[slot] = tensor.to(self.dtype) if tensor.is_floating_point() else tensor
        args, kwargs = tree_unflatten(leaves, self.spec)
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
        args, kwargs = program.example_inputs
        leaves, spec = tree_flatten((args, kwargs))
        flat = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        wrapped = _CastIO(module, self.dtype, leaves, spec)
        recaptured = torch.export.export(wrapped, tuple(flat),
                                         dynamic_shapes=(_flat_dynamic_shapes(program),),
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


def _flat_dynamic_shapes(program: ExportedProgram) -> tuple:
    """One Dim per symbol of the original program, with its bounds, for the flat inputs."""
    dims: dict = {}
    shapes = []
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in program.graph_signature.user_inputs:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        entry = {}
        for axis, size in enumerate(val.shape):
            if isinstance(size, torch.SymInt) and not size.node.expr.is_number:
                expr = size.node.expr
                if expr not in dims:
                    bounds = program.range_constraints[expr]
                    dims[expr] = Dim(f"d{len(dims)}", min=int(bounds.lower),
                                     max=int(bounds.upper))
                entry[axis] = dims[expr]
        shapes.append(entry or None)
    return tuple(shapes)
