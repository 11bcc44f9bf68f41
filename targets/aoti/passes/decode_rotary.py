"""The rotary embedding of a decode step's queries and keys, as the q/k/v product's
epilogue (row_gemv's rotary rows) instead of a pointwise kernel between the product and
the attention:

    before: qkv = row_gemv(x, W_qkv, ...); q, k, v = split(qkv)     (views)
            q' = q * cos + cat(-q[..., D/2:], q[..., :D/2]) * sin   (one Inductor kernel for
            k' = k * cos + cat(-k[..., D/2:], k[..., :D/2]) * sin    q and k, a launch a layer)
    after:  qkv = row_gemv(x, W_qkv, ..., cos, sin, rotary_rows, D); q', k', v = split(qkv)

Only the rotate-half form over whole heads (LLaMA's, Qwen's, Gemma's), on pieces that
start the product's output (queries, then keys): the kernel rotates its first rows.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch.fx import Node

from targets.aoti.passes.decode_patterns import calls, strip_casts, val

aten = torch.ops.aten
_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
_TRANSPOSES = (aten.transpose.int, aten.permute.default)
_PURE = (*_VIEWS, *_TRANSPOSES, aten.split_with_sizes.default, aten.slice.Tensor,
         aten.unsqueeze.default, aten.alias.default, operator.getitem)


@dataclass(frozen=True)
class Rotary:
    cos: Node
    sin: Node
    rows: int  # the product's first rows that are rotated
    head_dim: int
    replaced: tuple[tuple[Node, Node], ...]  # (rotated heads, the heads the op now rotates)


def match_rotary(product: Node) -> Rotary | None:
    """The rotary embedding of the first pieces of ``product``'s output split along its
    last dim, each piece viewed as heads of the same D (cos and sin alike), or None."""
    order = {node: i for i, node in enumerate(product.graph.nodes)}
    _merge_same_views(product, order)
    splits = _splits_of(product)
    if len(splits) != 1:
        return None
    split = splits[0]
    sizes = list(split.args[1])
    if (split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)) not in (
            -1, val(product).dim() - 1):
        return None
    pieces = {user.args[1]: user for user in split.users
              if calls(user, operator.getitem)}
    found, rows = [], 0
    for index, size in enumerate(sizes):
        rotated = [_rotation(heads) for heads in _heads(pieces.get(index))]
        rotated = [r for r in rotated if r is not None]
        if len(rotated) != 1:
            break
        found.append(rotated[0])
        rows += size
    if not found:
        return None
    cos, sin, dim = found[0][2], found[0][3], found[0][4]
    if any(f[2] is not cos or f[3] is not sin or f[4] != dim for f in found) or rows % dim:
        return None
    if max(order[cos], order[sin]) > order[product]:  # the op reads them: made before it
        return None
    return Rotary(cos, sin, rows, dim, tuple((f[0], f[1]) for f in found))


def _merge_same_views(node: Node, order: dict) -> None:
    """The views, splits and pieces of ``node`` that are the same op on the same arguments
    become one, and so on down: after the quantize's decompositions each use of q/k/v
    has its own split and views of the product."""
    kept = {}
    for user in sorted(node.users, key=order.get):
        if not calls(user, *_PURE) or user.args[0] is not node or \
                any(isinstance(a, Node) for a in user.args[1:]) or user.kwargs:
            continue
        key = (user.target, _frozen(user.args[1:]))
        if key in kept:
            user.replace_all_uses_with(kept[key])
            node.graph.erase_node(user)
        else:
            kept[key] = user
    for user in kept.values():
        _merge_same_views(user, order)


def _frozen(value):
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


def _splits_of(node: Node) -> list[Node]:
    """The splits of ``node``'s values along their last dim, through views that keep it."""
    found = []
    for user in node.users:
        if calls(user, aten.split_with_sizes.default):
            found.append(user)
        elif calls(user, *_VIEWS) and val(user) is not None and \
                val(user).shape[-1] == val(node).shape[-1]:
            found.extend(_splits_of(user))
    return found


def _heads(piece: Node | None) -> list[Node]:
    """``piece`` viewed as heads along its last dim (a view that splits it, then
    transposes that keep the last dim last): the nodes of those heads."""
    if piece is None:
        return []
    width = val(piece).shape[-1]
    out = []
    for view in piece.users:
        shape = val(view).shape if val(view) is not None else None
        if not calls(view, *_VIEWS) or shape is None or width % shape[-1]:
            continue
        node = view
        while len(node.users) == 1 and calls(next(iter(node.users)), *_TRANSPOSES) and \
                _keeps_last(next(iter(node.users))):
            node = next(iter(node.users))
        out.append(node)
    return out


def _keeps_last(node: Node) -> bool:
    rank = val(node.args[0]).dim()
    if calls(node, aten.transpose.int):
        return rank - 1 not in [d % rank for d in node.args[1:3]]
    return list(node.args[1])[-1] % rank == rank - 1


def _rotation(heads: Node) -> tuple | None:
    """(the rotated heads, ``heads``, cos, sin, D) where ``heads * cos +
    cat(-heads[..., D/2:], heads[..., :D/2]) * sin`` reads ``heads``."""
    dim = val(heads).shape[-1]
    for user in heads.users:
        if not calls(user, aten.mul.Tensor):
            continue
        for add in user.users:
            if not calls(add, aten.add.Tensor) or len(add.args) != 2:
                continue
            for direct, turned in (add.args, reversed(add.args)):
                cos = _other(direct, heads)
                sin = _other(turned, None, dim)
                if cos is not None and sin is not None and _vector(cos, dim) and \
                        _vector(sin, dim) and _rotated_half(turned, sin, heads, dim):
                    return add, heads, _source(cos, dim), _source(sin, dim), dim
    return None


def _source(node: Node, dim: int) -> Node:
    """The D values ``node`` holds, before the unsqueezes, views and casts that shaped them
    for the heads (made once a step; the shaped copies come a layer later)."""
    while (calls(node, aten.unsqueeze.default, *_VIEWS) or strip_casts(node) is not node) \
            and isinstance(node.args[0], Node) and _vector(node.args[0], dim):
        node = node.args[0]
    return node


def _other(mul, heads: Node | None, dim: int = 0) -> Node | None:
    """The factor of ``mul`` beside ``heads`` (or, with None, beside a cat of width dim)."""
    if not calls(mul, aten.mul.Tensor) or not all(isinstance(a, Node) for a in mul.args):
        return None
    a, b = mul.args
    if heads is not None:
        return b if a is heads else a if b is heads else None
    return b if calls(a, aten.cat.default) else a if calls(b, aten.cat.default) else None


def _vector(node: Node, dim: int) -> bool:
    """A value of D elements broadcast over every other dim (cos or sin of one row)."""
    value = val(node)
    return value is not None and value.numel() == dim and value.shape[-1] == dim


def _rotated_half(mul: Node, sin: Node, heads: Node, dim: int) -> bool:
    """``mul`` is ``cat(-heads[..., D/2:], heads[..., :D/2], -1) * sin``."""
    cat = mul.args[0] if mul.args[1] is sin else mul.args[1]
    if not calls(cat, aten.cat.default) or len(cat.args[0]) != 2 or \
            (cat.args[1] if len(cat.args) > 1 else 0) not in (-1, val(heads).dim() - 1):
        return False
    negated, first = cat.args[0]
    if not calls(negated, aten.neg.default):
        return False
    return (_half(first, heads, 0, dim // 2, dim) and
            _half(negated.args[0], heads, dim // 2, dim, dim))


def _half(node, heads: Node, start: int, end: int, dim: int) -> bool:
    if not calls(node, aten.slice.Tensor) or node.args[0] is not heads:
        return False
    axis, lo, hi = (list(node.args[1:]) + [0, None, None])[:3]
    rank = val(heads).dim()
    return axis % rank == rank - 1 and (lo or 0) == start and (hi is None or min(hi, dim) == end)
