"""Drop the empty operands of a concatenation.

    before: y = cat([rotated, q[..., 16:]], -1)     q[..., 16:] is [1, 4, T, 0]
    after:  y = clone(rotated, memory_format=contiguous_format)

transformers' partial-rotary models (Phi-3, and others written the same way) compute
``cat(rotated part, untouched part)``, and the untouched part is empty when the rotary
covers the whole head. Inductor's CPU cat (``ConcatKernel``) lays its output out like its
inputs, here a transposed view, where eager's cat returns a contiguous tensor; a later
``view`` of it then failed to compile ("Cannot view a tensor with shape [1, 4, s, 16] and
strides (64*s, 16, 64, 1)"): Phi-3's quantized prefill on ``cpu``. The contiguous clone
is what eager's cat returned.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import rewrite_and_recapture

_CAT = torch.ops.aten.cat.default


class DropEmptyConcatOperands:
    name = "drop_empty_concat_operands"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_and_recapture(program, _drop_all, "operands_dropped")


def _drop_all(module: torch.fx.GraphModule) -> dict:
    dropped = 0
    for node in list(module.graph.nodes):
        if node.op != "call_function" or node.target is not _CAT or node.kwargs:
            continue
        operands = list(node.args[0])
        kept = [x for x in operands if not _statically_empty(x)]
        if len(kept) == len(operands) or not kept or not _same_dtype(operands):
            continue
        dim = node.args[1] if len(node.args) > 1 else 0
        with module.graph.inserting_before(node):
            if len(kept) == 1:
                new = module.graph.call_function(
                    torch.ops.aten.clone.default, (kept[0],),
                    {"memory_format": torch.contiguous_format})
            else:
                new = module.graph.call_function(_CAT, (kept, dim))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        module.graph.erase_node(node)
        dropped += len(operands) - len(kept)
    if dropped:
        module.graph.eliminate_dead_code()
        module.recompile()
    return {"operands_dropped": dropped}


def _statically_empty(node: object) -> bool:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(value, torch.Tensor) and any(
        isinstance(size, int) and size == 0 for size in value.shape)


def _same_dtype(operands: list) -> bool:
    """An empty operand of another dtype still promotes the result: left alone."""
    dtypes = {x.meta["val"].dtype for x in operands
              if isinstance(x, torch.fx.Node) and isinstance(x.meta.get("val"), torch.Tensor)}
    return len(dtypes) == 1
