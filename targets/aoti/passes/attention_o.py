"""A decode layer's attention and o's product (+ residual) as one launch.

    before: a = decode_attention(q, past_k, k, past_v, v, mask, counts)
            out = row_gemv(a.transpose(1, 2).reshape(1, 1, -1), Wo, residual=h)
    after:  out = decode_attention_o(q, past_k, k, past_v, v, mask, counts, Wo, h,
                                     flags, slot, reset)

The op's kernel (kernels/attention_o_triton.py) runs the attention's blocks and o's rows
in one grid: o's rows load Wo while the attention computes and spin on a flag its joins
count on, so a layer loses a kernel boundary. ``join_attention_with_o`` makes that choice
in the decode pass, where the cuda target asks (``Generation.attention_o``), for a joined
``decode_attention`` whose output only o's product reads, through the transpose and
reshape to a row: o with the residual and nothing else (no norm, bias, activation or
rotary rows), over float rows of the query's dtype or int8 rows with their scales (int4
rows with their groups' (scale, offset) pairs too where the target asks:
``Generation.int4_fused``), in the kernel's shapes (``attention_o_slots.joins_o``). An attention that stores the
step's rows (``decode_attention_store``: the attention pass, run before, chose it) is
joined as ``decode_attention_o_store``, which stores them as it did (its positions the
last argument, the same past buffers declared mutated), so attention_store.py's
``stored_outputs`` still names those rows.

The launches share one int32 buffer of flag slots, zeros made once a call, and take
their slots in order (``flag_slots``): each zeroes the next one's.
"""

from __future__ import annotations

import torch
from torch._inductor import inductor_prims

from passes.graph.rewrite import attribute
from targets.aoti.kernels import ops
from targets.aoti.kernels.attention_o_slots import SLOTS, STRIDE, flag_slots, joins_o
from targets.aoti.passes.decode_patterns import val

_VIEWS = (torch.ops.aten.reshape.default, torch.ops.aten.view.default,
          torch.ops.aten._unsafe_view.default)
_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_JOINED = (ops.decode_attention, ops.decode_attention_store)  # both joined by the counts


def join_attention_with_o(module: torch.fx.GraphModule, int4: bool = False) -> int:
    """Each attention of ``module`` (the decode pass's, its products already row_gemv)
    whose output o's product alone reads becomes one ``decode_attention_o`` with o (one
    that stores its rows: ``decode_attention_o_store``); returns how many. ``int4``: o
    over int4 rows too."""
    pairs = [found for found in (_attention_and_o(module, node, int4)
                                 for node in module.graph.nodes) if found]
    if not pairs:
        return 0
    first = val(pairs[0][0].args[0])
    with module.graph.inserting_before(pairs[0][0]):
        zeros = module.graph.call_function(torch.ops.aten.zeros.default, (
            [SLOTS * STRIDE],), {"dtype": torch.int32, "device": first.device})
        zeros.meta["val"] = first.new_zeros((SLOTS * STRIDE,), dtype=torch.int32)
        # one stored buffer, not a fill of each launch's own (decode_stored.py)
        flags = module.graph.call_function(inductor_prims.force_stride_order, (zeros, [1]))
        flags.meta = dict(zeros.meta)
    for (attention, o), (slot, reset) in zip(pairs, flag_slots(len(pairs))):
        x, weight, _, _, residual, _, _, _, *scale = o.args
        stores = attention.target is ops.decode_attention_store
        with module.graph.inserting_before(o):
            joined = module.graph.call_function(
                ops.decode_attention_o_store if stores else ops.decode_attention_o, (
                    *attention.args[:9], weight, scale[0] if scale else None, residual,
                    flags, slot, reset, *attention.args[9:10]))  # the store's positions
        joined.meta = dict(o.meta)
        o.replace_all_uses_with(joined)
        module.graph.erase_node(o)
        for node in (x, x.args[0], attention):  # the reshape, the transpose, the attention
            module.graph.erase_node(node)
    return len(pairs)


def _attention_and_o(module: torch.fx.GraphModule, node: torch.fx.Node,
                     int4: bool) -> tuple | None:
    """(the joined decode_attention, o's row_gemv) where ``node`` is the attention and
    the kernel takes both, else None."""
    if node.op != "call_function" or node.target not in _JOINED \
            or len(node.args) < 9 or node.args[8] is None:
        return None
    turned = _only_user(node)
    if turned is None or turned.target is not torch.ops.aten.transpose.int \
            or sorted(turned.args[1:]) != [1, 2]:
        return None
    row = _only_user(turned)
    if row is None or row.target not in _VIEWS:
        return None
    o = _only_user(row)
    if o is None or o.target is not ops.row_gemv or o.args[0] is not row:
        return None
    query, past_k = val(node.args[0]), val(node.args[1])
    if not _plain_o(module, o, query.dtype, int4):
        return None
    heads, dim, slots = query.shape[1], query.shape[-1], past_k.shape[2]
    if tuple(val(row).shape) != (1, 1, heads * dim) or not joins_o(heads, dim, slots):
        return None
    return node, o


def _plain_o(module: torch.fx.GraphModule, o: torch.fx.Node, dtype: torch.dtype,
             int4: bool) -> bool:
    """o's product with a residual and nothing else, over rows the kernel reads: float of
    the attention's dtype, int8 with a scale a row, or (``int4``) int4 rows with a
    (scale, offset) pair a group."""
    x, weight, bias, norm, residual, _, _, act, *rest = o.args
    scale = rest[0] if rest else None
    rotary = rest[1:5] if len(rest) > 1 else ()
    if bias is not None or norm is not None or residual is None or act \
            or any(r not in (None, 0) for r in rotary):
        return False
    w, scales = (_tensor(module, n) for n in (weight, scale))
    if w is None or w.dim() != 2 or val(residual) is None or val(residual).dtype != dtype:
        return False
    if w.dtype == torch.int8:
        return scales is not None and scales.numel() == w.shape[0]
    if w.dtype == torch.uint8:  # only where asked: the kernel's A/B decides
        return int4 and scales is not None and scales.dim() == 3 \
            and scales.shape[0] == w.shape[0] and scales.shape[2] == 2 \
            and (2 * w.shape[1]) % scales.shape[1] == 0
    return w.dtype in _FLOATS and w.dtype == dtype and scale is None


def _tensor(module: torch.fx.GraphModule, node) -> torch.Tensor | None:
    """A node's value: a weight's (get_attr) or what capture recorded."""
    return attribute(module, node) if attribute(module, node) is not None else val(node)


def _only_user(node: torch.fx.Node) -> torch.fx.Node | None:
    users = list(node.users)
    if len(users) != 1 or users[0].op != "call_function":
        return None
    return users[0]
