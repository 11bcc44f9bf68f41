"""A decode layer's gated MLP (gate/up, then down + residual) as one launch.

    before: a = row_gemv(x, W_gate_up, norm=w, act=silu)
            out = row_gemv(a, W_down, residual=h)
    after:  out = gated_mlp(x, W_gate_up, W_down_t, w, h, ..., acc, counts)

The op's kernel (kernels/mlp_triton.py) splits down along the intermediate width: each
program multiplies its block of gated values into the matching rows of down's weight
stored transposed (``W_down_t`` [I, N], so a program's share is contiguous), adds its
sums into ``acc`` and the last to finish adds the residual, so a layer loses a kernel
boundary and down streams as gate/up does. ``join_gate_up_with_down`` makes that choice
in the decode pass, where the cuda target asks (``Generation.mlp_fused``), for float rows
of x's dtype with no bias, scales or rotary rows. A generating artifact keeps one copy of
each weight by content (exporter/builder/shared_weights.py): ``transposed_downs`` stores
the prompt program's down weights transposed too, so both programs read the same tensor.

The launches share one buffer of sums and one counter, zeros made once a call; each
launch leaves them at zero for the next.
"""

from __future__ import annotations

import torch
from torch._inductor import inductor_prims

from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import add_constant, attribute, rewrite_and_recapture
from targets.aoti.kernels import ops
from targets.aoti.passes.decode_patterns import match_gated, val
from targets.aoti.passes.row_linears import _one_row

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_LINEAR = torch.ops.aten.linear.default


def join_gate_up_with_down(module: torch.fx.GraphModule, exact: bool = False) -> int:
    """Each gated product of ``module`` (the decode pass's, its products already
    row_gemv) whose output down's product alone reads becomes one ``gated_mlp``; returns
    how many. ``exact``: the sums added as int64 fixed point, in any order the same
    result (``--deterministic``), not as float32."""
    pairs = [found for found in (_gate_up_and_down(module, node)
                                 for node in module.graph.nodes) if found]
    if not pairs:
        return 0
    first = val(pairs[0][0].args[0])
    width = max(attribute(module, down.args[1]).shape[0] for _, down in pairs)
    with module.graph.inserting_before(pairs[0][0]):
        acc = _zeros(module, first, width, torch.int64 if exact else torch.float32)
        counts = _zeros(module, first, 1, torch.int32)
    for gate_up, down in pairs:
        x, weight, _, norm, _, eps, offset, act = gate_up.args[:8]
        down_weight = down.args[1]
        transposed = add_constant(module, f"{down_weight.target}_t",
                                  attribute(module, down_weight).t().contiguous(), down)
        with module.graph.inserting_before(down):
            joined = module.graph.call_function(ops.gated_mlp, (
                x, weight, transposed, norm, down.args[4], eps, offset, act, acc, counts))
        joined.meta = dict(down.meta)
        down.replace_all_uses_with(joined)
        module.graph.erase_node(down)
        module.graph.erase_node(gate_up)
    return len(pairs)


def _zeros(module: torch.fx.GraphModule, like: torch.Tensor, size: int,
           dtype: torch.dtype) -> torch.fx.Node:
    zeros = module.graph.call_function(torch.ops.aten.zeros.default, ([size],), {
        "dtype": dtype, "device": like.device})
    zeros.meta["val"] = like.new_zeros((size,), dtype=dtype)
    # one stored buffer, not a fill of each launch's own (decode_stored.py)
    stored = module.graph.call_function(inductor_prims.force_stride_order, (zeros, [1]))
    stored.meta = dict(zeros.meta)
    return stored


def _gate_up_and_down(module: torch.fx.GraphModule, node: torch.fx.Node) -> tuple | None:
    """(gate/up's row_gemv, down's) where ``node`` is a gated product over float rows
    whose output only down's product (+ residual) reads, down's weight read by it alone;
    else None."""
    if not _product(module, node, gated=True):
        return None
    users = list(node.users)
    if len(users) != 1 or not _product(module, users[0], gated=False) \
            or users[0].args[0] is not node:
        return None
    down = users[0]
    x, gate_up, down_weight = val(node.args[0]), node.args[1], down.args[1]
    if len(down_weight.users) != 1 or \
            attribute(module, down_weight).shape[1] * 2 != attribute(module, gate_up).shape[0]:
        return None
    if any(val(n) is None or val(n).dtype != x.dtype for n in (node, down)):
        return None
    return node, down


def _product(module: torch.fx.GraphModule, node: torch.fx.Node, gated: bool) -> bool:
    """A row_gemv over a float weight attribute with no bias, scales or rotary rows: with
    an activation and no residual (``gated``), or with neither a norm nor an activation."""
    if node.op != "call_function" or node.target is not ops.row_gemv:
        return False
    x, weight, bias, norm, residual, _, _, act, *rest = node.args
    if bias is not None or any(r not in (None, 0) for r in rest):
        return False
    if gated != bool(act) or (residual is not None if gated else norm is not None):
        return False
    w = attribute(module, weight)
    return w is not None and w.dim() == 2 and w.dtype in _FLOATS and \
        val(x) is not None and w.dtype == val(x).dtype


class PromptDownsTransposed:
    """A generating build's prompt program reads each gated MLP's down weight as the
    decode step's ``gated_mlp`` does (``transposed_downs``), so the artifact stores it
    once."""
    name = "prompt_downs_transposed"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_and_recapture(
            program, lambda module: {"downs_transposed": transposed_downs(module)},
            "downs_transposed")


def transposed_downs(module: torch.fx.GraphModule) -> int:
    """Each gated MLP's down linear of more than one row (``act(y[:I]) * y[I:]`` of a
    gate/up linear, then a linear over a float weight it alone reads, no bias) as a
    matmul with that weight stored transposed, as the decode step's ``gated_mlp`` reads
    it (a one-row linear is the decode pass's). Returns how many."""
    changed = 0
    for node in list(module.graph.nodes):
        if node.op != "call_function" or node.target is not _LINEAR or _one_row(node):
            continue
        gated = match_gated(node)
        if gated is None or len(gated[0].users) != 1:
            continue
        down = next(iter(gated[0].users))
        if down.op != "call_function" or down.target is not _LINEAR or \
                down.args[0] is not gated[0] or \
                (down.args[2] if len(down.args) > 2 else down.kwargs.get("bias")) is not None:
            continue
        weight = attribute(module, down.args[1])
        if weight is None or weight.dtype not in _FLOATS or len(down.args[1].users) != 1:
            continue
        transposed = add_constant(module, f"{down.args[1].target}_t",
                                  weight.t().contiguous(), down)
        with module.graph.inserting_before(down):
            product = module.graph.call_function(torch.ops.aten.matmul.default,
                                                 (gated[0], transposed))
        product.meta = dict(down.meta)
        down.replace_all_uses_with(product)
        module.graph.erase_node(down)
        changed += 1
    return changed
