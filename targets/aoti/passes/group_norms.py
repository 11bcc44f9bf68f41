"""A one-group GroupNorm's statistics read in channels-last order, in two explicit levels:
two reduction kernels where Inductor generated three.

    before: y = group_norm(x, 1, w, b, eps)                        x: [N, C, H, W]
    after:  rows = float(x).permute(0, 2, 3, 1).reshape(N, S, L / S)   L = C*H*W, S chunks
            var_s, mean_s = var_mean(rows, -1)                     each chunk's, [N, S]
            mean = mean(mean_s);  var = mean(var_s + (mean_s - mean)^2)   (chunks of one size)
            y = ((float(x) - mean) * rsqrt(var + eps) * w + b).to(x.dtype)

Inductor lays a convolutional program out channels-last, and splits a reduction of one
group's L elements in two; reading them in NCHW order from channels-last memory, it took
the first half for a strided one and split it again (e.g. 1575 x 128 -> 25 x 63 -> 1 x 25
for PoolFormer's 64x56x56). Read in memory order, S chunks of at most ``CHUNK`` elements
are one persistent reduction kernel and the S partial statistics one more, whatever
Inductor's split heuristic picks. The chunks' combination is exact (the law of total
variance); each chunk is Welford's, as before. Only where Inductor lays the program out
channels-last (the program still has a 2-D convolution: its layout choice needs one), 4-D
half-precision inputs (what was measured) and groups Inductor would split.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import replace_calls, rewrite_and_recapture
from targets.aoti.passes.conv_calls import conv2d_call

_GROUP_NORM = torch.ops.aten.group_norm.default
_GROUP_NORM_ARGS = ("input", "num_groups", "weight", "bias", "eps")
CHUNK = 1024  # Inductor's persistent reductions go up to this many elements a row
# Inductor (choices.reduction_split_factor) splits a lone row of more elements than this
# on GPUs before compute capability 10; at or under it, the statistics are one kernel.
SPLIT_ABOVE = 8192


class OneGroupNormsInPixelOrder:
    name = "one_group_norms_in_pixel_order"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_and_recapture(program, _rewrite_all, "one_group_norms_rewritten")


def one_group_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   eps: float, chunks: int) -> torch.Tensor:
    """``group_norm(x, 1, weight, bias, eps)`` with its statistics over ``chunks`` equal
    chunks of ``x`` in channels-last order, in fp32."""
    n, c = x.shape[:2]
    rows = x.float().permute(0, 2, 3, 1).reshape(n, chunks, -1)
    var_s, mean_s = torch.var_mean(rows, -1, correction=0)
    mean = mean_s.mean(-1, keepdim=True)
    var = (var_s + (mean_s - mean) ** 2).mean(-1, keepdim=True)
    per_sample = (n, 1, 1, 1)
    out = (x.float() - mean.reshape(per_sample)) * torch.rsqrt(var + eps).reshape(per_sample)
    if weight is not None:
        out = out * weight.float().reshape(c, 1, 1)
    if bias is not None:
        out = out + bias.float().reshape(c, 1, 1)
    return out.to(x.dtype)


def chunk_count(elements: int) -> int | None:
    """The fewest equal chunks of at most CHUNK elements, if at most CHUNK of them."""
    least = -(-elements // CHUNK)
    return next((s for s in range(least, CHUNK + 1) if elements % s == 0), None)


def _rewrite_all(module: torch.fx.GraphModule) -> dict:
    if not any(conv2d_call(node) for node in module.graph.nodes):
        return {"one_group_norms_rewritten": 0}

    def arguments(node):
        found = _one_group_args(node)
        return None if found is None else (found, {})
    return replace_calls(module, arguments, one_group_norm, "one_group_norms_rewritten")


def _one_group_args(node: torch.fx.Node) -> tuple | None:
    """(x, weight, bias, eps, chunks) where ``node`` is a one-group GroupNorm of a static
    4-D half-precision input Inductor would split, else None."""
    if node.op != "call_function" or node.target is not _GROUP_NORM:
        return None
    given = {"weight": None, "bias": None, "eps": 1e-5,
             **dict(zip(_GROUP_NORM_ARGS, node.args)), **node.kwargs}
    x, groups = given["input"], given["num_groups"]
    value = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if groups != 1 or value is None or value.dim() != 4:
        return None
    if value.dtype not in (torch.float16, torch.bfloat16):
        return None
    if not all(isinstance(d, int) for d in value.shape):
        return None
    elements = value.shape[1] * value.shape[2] * value.shape[3]
    chunks = chunk_count(elements) if elements > SPLIT_ABOVE else None
    if chunks is None:
        return None
    return x, given["weight"], given["bias"], given["eps"], chunks
