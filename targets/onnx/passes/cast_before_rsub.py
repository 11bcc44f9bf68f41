"""Cast an integer tensor to the float result before ``number - tensor``.

``1.0 - attention_mask`` (XLNet, and masks written this way in many models) is
``rsub.Scalar(mask, 1.0)`` on an int64 mask with a float32 result. torch.onnx's
decomposition turns it into ``sub.Tensor(1.0, mask)``, and its dispatcher then finds no
translation whose types take a float number and an int64 tensor together, so the whole
partition failed to export and the op went to the CPU fallback (and the artifact needed
torch on the device for one subtraction). Casting first is what type promotion does
anyway, so the value is the same; a float tensor minus a float number translates.

    before: rsub.Scalar(mask: int64, 1.0) -> float32
    after:  rsub.Scalar(_to_copy(mask, dtype=float32), 1.0)
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult

aten = torch.ops.aten


class CastBeforeRsub:
    name = "cast_before_rsub"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        graph, count = program.graph, 0
        for node in list(graph.nodes):
            source, dtype = _promoted(node)
            if source is None:
                continue
            with graph.inserting_before(node):
                cast = graph.call_function(aten._to_copy.default, (source,), {"dtype": dtype})
            cast.meta = {k: v for k, v in node.meta.items() if k != "val"}
            cast.meta["val"] = source.meta["val"].to(dtype)
            node.replace_input_with(source, cast)
            count += 1
        if count:
            program.graph_module.recompile()
        return PassResult(program, modified=bool(count), info={"casts_inserted": count})


def _promoted(node: torch.fx.Node) -> tuple[torch.fx.Node | None, torch.dtype | None]:
    """The integer tensor of a ``rsub.Scalar`` whose result is a float, and that float
    dtype; (None, None) for every other node."""
    if node.op != "call_function" or node.target is not aten.rsub.Scalar:
        return None, None
    source, result = node.args[0], node.meta.get("val")
    given = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not isinstance(given, torch.Tensor) or not isinstance(result, torch.Tensor):
        return None, None
    if given.dtype.is_floating_point or given.dtype.is_complex or given.dtype == result.dtype:
        return None, None
    return source, result.dtype
