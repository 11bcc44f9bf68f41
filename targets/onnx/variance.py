"""Variance and standard deviation as plain aten ops, for the onnx target's decomposition
table (targets/onnx/target.py ``_exporter_tables``).

torch.onnx's own table turns ``torch.std(x, -1, keepdim=True)`` into ``prims.var`` and a
``prims.broadcast_in_dim`` for the kept dim, and its functionalization then refuses that
view outside aten: the op ran on the CPU fallback, a partition switch in every layer that
has it (Gemma 3n's activation sparsity, 2 ops a program). Here they are the means, the
squares that torchlib translates (ReduceMean, Sub, Mul, Sqrt).

    before: v = var(x, [-1], correction=c, keepdim=True)
    after:  d = x - mean(x, [-1], keepdim=True); v = mean(d * d, [-1], keepdim=True) * n / (n - c)
"""

from __future__ import annotations

import math

import torch

aten = torch.ops.aten


def _dims(x: torch.Tensor, dim) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.dim()))
    return [d % x.dim() for d in (dim if isinstance(dim, (list, tuple)) else [dim])]


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    dims = _dims(x, dim)
    mean = aten.mean.dim(x, dims, True)
    centred = x - mean
    var = aten.mean.dim(centred * centred, dims, keepdim)
    taken = 1 if correction is None else correction
    if taken:  # n / (n - taken), as a tensor where n is a dynamic size (torch.onnx typed
        # an int size times a float as int64: the model it wrote did not load)
        count = math.prod(x.shape[d] for d in dims)
        if not isinstance(count, int):
            count = aten.full.default([], count, dtype=x.dtype, device=x.device)
        var = var * (count / (count - taken))
    # a second mean where the dims go: squeeze decomposes to prims.squeeze, a view again
    return var, mean if keepdim else aten.mean.dim(x, dims, False)


def _var(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction=correction, keepdim=keepdim)[0]


def _std(x, dim=None, *, correction=None, keepdim=False):
    return aten.sqrt.default(_var(x, dim, correction=correction, keepdim=keepdim))


def _std_mean(x, dim=None, *, correction=None, keepdim=False):
    var, mean = _var_mean(x, dim, correction=correction, keepdim=keepdim)
    return aten.sqrt.default(var), mean


def _unbiased(fn):
    """The ``.dim`` and ``.default`` overloads say ``unbiased`` where ``.correction`` says
    how many to take from the count."""
    def with_dim(x, dim, unbiased=True, keepdim=False):
        return fn(x, dim, correction=int(unbiased), keepdim=keepdim)

    def whole(x, unbiased=True):
        return fn(x, None, correction=int(unbiased))
    return with_dim, whole


def decompositions() -> dict:
    """{overload: its decomposition} for the table run_decompositions applies."""
    table = {}
    for name, fn in (("var", _var), ("std", _std), ("var_mean", _var_mean),
                     ("std_mean", _std_mean)):
        packet = getattr(aten, name)
        with_dim, whole = _unbiased(fn)
        table.update({packet.correction: fn, packet.dim: with_dim, packet.default: whole})
    return table
