"""Graph patterns around a batch-1 decode step's products, as the decode-kernel passes
(decode_kernels.py) find them in a captured ATen graph: an RMSNorm feeding a linear, an
int8 weight-only linear as torchao's tensor decomposes, a gated MLP's activation-times-up
over a merged gate/up linear, a residual add after a linear, and SDPA over
``cat(past, new)`` keys and values. Each matcher returns the pieces the fused op takes,
or None; casts between the ops (``.float()``, ``.to(dtype)``) are looked through, so
LLaMA's, Qwen's and Gemma's norms read alike.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch.fx import Node

aten = torch.ops.aten
_CASTS = {aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.type_as.default,
          torch.ops.prims.convert_element_type.default, aten.alias.default}
_ACTIVATIONS = {aten.silu.default: 1}  # reference.ACTIVATIONS' index; gelu: _gelu
_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class Norm:
    hidden: Node  # what the norm reads
    weight: Node  # its scale (a get_attr)
    eps: float
    offset: float  # Gemma scales by (1 + weight)


def val(node) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, Node) else None
    return value if isinstance(value, torch.Tensor) else None


def calls(node, *targets) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target in targets


def strip_casts(node):
    """What ``node`` is a cast or an alias of, or a slice that keeps every element of (the
    head's ``hidden[:, -logits_to_keep:]`` of one row is one of the two)."""
    while calls(node, *_CASTS) or (calls(node, aten.slice.Tensor) and val(node) is not None
                                   and val(node.args[0]) is not None
                                   and val(node).shape == val(node.args[0]).shape):
        node = node.args[0]
    return node


def match_norm(node: Node) -> Norm | None:
    """An RMSNorm over the last dim whose output is ``node`` (casts around it allowed)."""
    node = strip_casts(node)
    if calls(node, aten.rms_norm.default) and len(node.args) >= 3 and node.args[2] is not None:
        eps = node.args[3] if len(node.args) > 3 else node.kwargs.get("eps")
        weight = strip_casts(node.args[2])
        if eps is not None and weight.op == "get_attr":
            return Norm(node.args[0], weight, float(eps), 0.0)
        return None
    if not calls(node, aten.mul.Tensor):
        return None
    for scale, core in (node.args, reversed(node.args)):
        found = _scale(scale)
        inner = _core(strip_casts(core))
        if found is not None and inner is not None:
            return Norm(inner[0], found[0], inner[1], found[1])
    return None


def _scale(node) -> tuple[Node, float] | None:
    """The norm's weight, as ``w`` or ``1 + w`` (Gemma), a 1-D get_attr."""
    node = strip_casts(node)
    if calls(node, aten.add.Tensor, aten.add.Scalar) and len(node.args) == 2:
        weight, one = node.args
        if not isinstance(weight, Node):
            weight, one = one, weight
        if one == 1 or one == 1.0:
            inner = _scale(weight)
            return (inner[0], inner[1] + 1.0) if inner and inner[1] == 0.0 else None
        return None
    value = val(node)
    if isinstance(node, Node) and node.op == "get_attr" and value is not None \
            and value.dim() == 1:
        return node, 0.0
    return None


def _core(node) -> tuple[Node, float] | None:
    """``h * rsqrt(mean(h^2, -1, keepdim) + eps)``: (h, eps)."""
    if not calls(node, aten.mul.Tensor):
        return None
    for hidden, root in (node.args, reversed(node.args)):
        if not calls(root, aten.rsqrt.default):
            continue
        added = root.args[0]
        if not calls(added, aten.add.Tensor, aten.add.Scalar) or \
                isinstance(added.args[1], Node):
            continue
        mean = added.args[0]
        if not (calls(mean, aten.mean.dim) and _last_dim(mean) and
                (mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim"))):
            continue
        squared = mean.args[0]
        if calls(squared, aten.pow.Tensor_Scalar) and squared.args[1] == 2:
            base = squared.args[0]
        elif calls(squared, aten.mul.Tensor) and squared.args[0] is squared.args[1]:
            base = squared.args[0]
        else:
            continue
        if strip_casts(base) is strip_casts(hidden):
            return strip_casts(hidden), float(added.args[1])
    return None


def _last_dim(mean: Node) -> bool:
    dims, value = mean.args[1], val(mean.args[0])
    return value is not None and list(dims) in ([-1], [value.dim() - 1])


@dataclass(frozen=True)
class Int8Linear:
    x: Node  # the rows multiplied (before the product's 2-D view)
    weight: Node  # int8 [N, K], a get_attr
    scale: Node  # N per-row scales, a get_attr
    bias: Node | None
    out: Node  # what stands for the linear's output


_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
_TRANSPOSES = (aten.t.default, aten.permute.default, aten.transpose.int)


def match_int8_linear(mm: Node) -> Int8Linear | None:
    """torchao's int8 weight-only linear (Int8WeightOnlyConfig) after run_decompositions:
    ``view(mm(view(x, [-1, K]), t(w_int8).to(dtype)) * view(scale, [N]), [..., N])``,
    a bias added after, all in ``x``'s dtype."""
    if not calls(mm, aten.mm.default):
        return None
    rows, converted = mm.args
    transposed = strip_casts(converted)
    if transposed is converted or not calls(transposed, *_TRANSPOSES):
        return None
    weight = transposed.args[0]
    stored = val(weight)
    if not (isinstance(weight, Node) and weight.op == "get_attr" and stored is not None
            and stored.dtype == torch.int8 and stored.dim() == 2):
        return None
    x = rows.args[0] if calls(rows, *_VIEWS) else rows
    if val(x) is None or val(x).dtype not in _FLOATS or len(mm.users) != 1:
        return None
    scaled = next(iter(mm.users))
    if not calls(scaled, aten.mul.Tensor) or len(scaled.args) != 2:
        return None
    scale = _attr_of(scaled.args[1] if scaled.args[0] is mm else scaled.args[0])
    if scale is None or val(scale).numel() != stored.shape[0]:
        return None
    out = scaled
    if len(out.users) == 1 and calls(next(iter(out.users)), *_VIEWS):
        out = next(iter(out.users))
    bias = _bias_after(out, stored.shape[0])
    if bias is not None:
        out = next(iter(out.users))
    if val(out) is None or val(out).dtype != val(x).dtype:
        return None
    return Int8Linear(x, weight, scale, bias, out)


def _attr_of(node) -> Node | None:
    """The get_attr ``node`` is, or is a view or cast of (an fp16 model's int8 linear
    keeps its scales float32 and casts them at use; the kernel reads either as float)."""
    while calls(node, *_VIEWS, *_CASTS):
        node = node.args[0]
    return node if isinstance(node, Node) and node.op == "get_attr" and val(node) is not None \
        else None


def _bias_after(out: Node, width: int) -> Node | None:
    """A 1-D get_attr of ``width`` added to ``out`` (its only use)."""
    if len(out.users) != 1:
        return None
    add = next(iter(out.users))
    if not calls(add, aten.add.Tensor) or len(add.args) != 2 or add.kwargs.get("alpha", 1) != 1:
        return None
    other = _attr_of(add.args[1] if add.args[0] is out else add.args[0])
    if other is None or tuple(val(other).shape) != (width,) or \
            val(other).dtype != val(out).dtype:
        return None
    return other


def match_gated(linear: Node) -> tuple[Node, int] | None:
    """``act(y[..., :I]) * y[..., I:]`` over the linear's output ``y`` of width 2I (a merged
    gate/up projection, gate first): (the product node, the activation's index)."""
    value = val(linear)
    if value is None or value.shape[-1] % 2:
        return None
    half = value.shape[-1] // 2
    parts = _halves(linear, half, value.dim())
    if parts is None:
        return None
    gate, up = parts
    if len(gate.users) != 1 or len(up.users) != 1:
        return None
    act = next(iter(gate.users))
    index = _activation(act)
    if index is None or len(act.users) != 1:
        return None
    product = next(iter(act.users))
    if calls(product, aten.mul.Tensor) and set(product.args) == {act, up}:
        return product, index
    return None


def _activation(node) -> int | None:
    if calls(node, *_ACTIVATIONS):
        return _ACTIVATIONS[node.target]
    if calls(node, aten.gelu.default):
        approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1
                                      else "none")
        return {"none": 2, "tanh": 3}.get(approximate)
    return None


def _halves(linear: Node, half: int, rank: int) -> tuple[Node, Node] | None:
    """The two halves of ``linear``'s last dim, as a split's items or two slices."""
    users = list(linear.users)
    last = (-1, rank - 1)
    if len(users) == 1 and calls(users[0], aten.split.Tensor, aten.split_with_sizes.default):
        split = users[0]
        sizes = split.args[1]
        dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
        even = list(sizes) == [half, half] if isinstance(sizes, (list, tuple)) \
            else sizes == half
        if dim not in last or not even:
            return None
        items = {user.args[1]: user for user in split.users
                 if calls(user, operator.getitem)}
        if set(items) == {0, 1} and len(split.users) == 2:
            return items[0], items[1]
        return None
    slices = {}
    for user in users:
        if not calls(user, aten.slice.Tensor) or user.args[1] not in last:
            return None
        start, end = (list(user.args[2:4]) + [None, None])[:2]
        slices[(start or 0, half * 2 if end is None or end >= half * 2 else end)] = user
    if set(slices) == {(0, half), (half, 2 * half)}:
        return slices[(0, half)], slices[(half, 2 * half)]
    return None


def match_residual(node: Node) -> tuple[Node, Node] | None:
    """``node + r`` (either order), its only use, with ``r`` of the same shape and dtype:
    (the add, r)."""
    if len(node.users) != 1:
        return None
    add = next(iter(node.users))
    if not calls(add, aten.add.Tensor) or add.kwargs.get("alpha", 1) != 1 or len(add.args) != 2:
        return None
    other = add.args[1] if add.args[0] is node else add.args[0]
    mine, theirs, out = val(node), val(other), val(add)
    if other is node or mine is None or theirs is None or out is None:
        return None
    if mine.shape != theirs.shape or mine.dtype != theirs.dtype or out.shape != mine.shape \
            or out.dtype != mine.dtype:
        return None
    return add, other


@dataclass(frozen=True)
class Attention:
    query: Node
    past_k: Node
    new_k: Node
    past_v: Node
    new_v: Node
    mask: Node
    scale: float


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
              "enable_gqa")


def match_decode_attention(node: Node) -> Attention | None:
    """SDPA of one query row over ``cat(past, new)`` keys and values (dim 2) with an
    additive mask of one row for every head, grouped heads allowed."""
    if not calls(node, aten.scaled_dot_product_attention.default):
        return None
    given = {**dict(zip(_SDPA_ARGS, node.args)), **node.kwargs}
    if given.get("dropout_p", 0.0) or given.get("is_causal", False):
        return None
    query, mask = val(given["query"]), val(given.get("attn_mask"))
    keys, values = _cat_pair(given["key"]), _cat_pair(given["value"])
    if query is None or mask is None or keys is None or values is None:
        return None
    past_k, new_k = (val(n) for n in keys)
    past_v, new_v = (val(n) for n in values)
    if any(t is None or t.dim() != 4 for t in (past_k, new_k, past_v, new_v)) \
            or query.dim() != 4:
        return None
    _, heads, rows, dim = query.shape
    _, kv_heads, slots, _ = past_k.shape
    shapes_ok = (query.shape[0] == 1 and rows == 1 and heads % kv_heads == 0
                 and (given.get("enable_gqa") or heads == kv_heads)
                 and tuple(new_k.shape) == (1, kv_heads, 1, dim)
                 and tuple(past_k.shape) == (1, kv_heads, slots, dim)
                 and tuple(past_v.shape[:3]) == (1, kv_heads, slots)
                 and tuple(new_v.shape) == (1, kv_heads, 1, past_v.shape[3])
                 and past_v.shape[3] == dim and dim <= 256
                 and tuple(mask.shape) == (1, 1, 1, slots + 1))
    dtypes = {t.dtype for t in (query, past_k, new_k, past_v, new_v, mask)}
    if not shapes_ok or len(dtypes) != 1 or dtypes.pop() not in _FLOATS:
        return None
    scale = given.get("scale")
    return Attention(given["query"], *keys, *values, given["attn_mask"],
                     float(dim ** -0.5 if scale is None else scale))


def _cat_pair(node) -> tuple[Node, Node] | None:
    if not calls(node, aten.cat.default):
        return None
    parts = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if len(parts) != 2 or dim not in (2, -2):
        return None
    return parts[0], parts[1]


# ops whose output is a view of their first argument: a write through one writes the input
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.alias.default,
          aten.slice.Tensor, aten.select.int, aten.unsqueeze.default, aten.squeeze.dim,
          aten.squeeze.dims, aten.expand.default, aten.permute.default,
          aten.transpose.int, aten.as_strided.default}
_READ_VIEWS = {aten.view.default, aten.alias.default, aten.slice.Tensor,
               aten.select.int, aten.unsqueeze.default}  # a kernel reads them in place


def unwritten_input(node: Node) -> bool:
    """Whether ``node`` is a step input (or a view of one kept in place) that no op of
    the graph writes, through any view: a dependent kernel may then read it before it
    waits for the kernel before (what the step itself wrote is not yet there)."""
    while calls(node, *_READ_VIEWS):
        node = node.args[0]
    if not isinstance(node, Node) or node.op != "placeholder":
        return False
    aliases, seen = [node], {node}
    while aliases:
        alias = aliases.pop()
        for user in alias.users:
            if calls(user, *_VIEWS) and user.args[0] is alias:
                if user not in seen:
                    seen.add(user)
                    aliases.append(user)
            elif user.op == "call_function" and _may_write(user, alias):
                return False
    return True


def _may_write(node: Node, alias: Node) -> bool:
    """Whether ``node`` may write ``alias``, one of its arguments (an op without a
    schema may)."""
    if node.target is operator.getitem:
        return False
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return True
    given = {**dict(zip((a.name for a in schema.arguments), node.args)), **node.kwargs}
    return any(a.alias_info is not None and a.alias_info.is_write
               and _holds(given.get(a.name), alias) for a in schema.arguments)


def _holds(value, node: Node) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_holds(v, node) for v in value)
    return value is node
