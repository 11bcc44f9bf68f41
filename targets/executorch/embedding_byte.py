"""Quantized embedding tables as ExecuTorch's ``embedding_byte`` kernel, as ExecuTorch's
own QuantFusionPass makes them: ``--quantize`` stores tables as torchao's int8 rows, whose
``dequantize_affine`` has neither an XNNPACK config nor an ExecuTorch kernel; left alone it
ran on the CPU fallback, dequantizing the whole table on every call.

    before: embedding(dequantize_affine(table: int8 [R, D], [1, G], scale, zero), ids)
    after:  quantized_decomposed.embedding_byte(table, scale [R, D/G], None, -128, 127, ids)

Only the gathered rows are dequantized (the quantized kernels library,
``executorch.kernels.quantized``, which the executor loads for such a program). A
dequantized table something else also reads (a tied output projection) stays for that
reader.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.in_place import rewrite_in_place
from passes.graph.rewrite import add_constant, attribute

_INT8 = (-128, 127)


class EmbeddingByte:
    name = "embedding_byte"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        import executorch.exir.passes._quant_patterns_and_replacements  # noqa: F401 - defines the op
        return rewrite_in_place(program, _rewrite, "tables")


def _rewrite(module: torch.fx.GraphModule) -> dict:
    tables = 0
    for node in list(module.graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.embedding.default:
            tables += _as_embedding_byte(module, node)
    module.graph.eliminate_dead_code()
    module.recompile()
    return {"tables": tables}


def _as_embedding_byte(module: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Replace one ``embedding(dequantize_affine(...), ids)``; False where the table is
    not int8 rows in float32 (that pattern stays as it is)."""
    found = _int8_rows(module, node.args[0])
    if found is None:
        return False
    values, scale, zero = found
    rows, groups = values.shape[0], scale.numel() // values.shape[0]
    dequantize = node.args[0]
    scale_node = add_constant(module, f"{dequantize.args[2].target}_rows",
                              scale.reshape(rows, groups), before=node)
    zero_node = (None if zero is None or not zero.any() else
                 add_constant(module, f"{dequantize.args[3].target}_rows",
                              zero.reshape(rows, groups).to(scale.dtype), before=node))
    with module.graph.inserting_before(node):
        fused = module.graph.call_function(
            torch.ops.quantized_decomposed.embedding_byte.default,
            (dequantize.args[0], scale_node, zero_node, *_INT8, node.args[1]))
    fused.meta = dict(node.meta)
    node.replace_all_uses_with(fused)
    module.graph.erase_node(node)
    return True


def _int8_rows(module: torch.fx.GraphModule, dequantize: object
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """(int8 values [R, D], scales, zero points) of a stored table torchao dequantizes
    in row groups to float32, or None."""
    if not (isinstance(dequantize, torch.fx.Node) and dequantize.op == "call_function"
            and dequantize.target is torch.ops.torchao.dequantize_affine.default):
        return None
    args = list(dequantize.args) + [None] * (8 - len(dequantize.args))
    values, block, scale = attribute(module, args[0]), args[1], attribute(module, args[2])
    zero = attribute(module, args[3])
    kwargs = dequantize.kwargs
    bounds = (kwargs.get("quant_min", args[5]), kwargs.get("quant_max", args[6]))
    out_dtype = kwargs.get("output_dtype", args[7]) or torch.float32
    if values is None or scale is None or values.dtype != torch.int8 or values.dim() != 2:
        return None
    if (args[3] is not None and zero is None) or bounds not in ((None, None), _INT8):
        return None
    if list(block)[:1] != [1] or values.shape[1] % block[1] or out_dtype != torch.float32:
        return None
    if scale.dtype != torch.float32 or scale.numel() != values.shape[0] * (
            values.shape[1] // block[1]):
        return None
    return values, scale, zero
