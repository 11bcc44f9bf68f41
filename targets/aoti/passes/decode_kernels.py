"""A batch-1 decode step's products and attention as the cuda target's own Triton kernels
(targets/aoti/kernels/), each with the small ops around it folded in.

    before: h = rmsnorm(x); y = linear(h, W)               (a norm-partial-sum kernel, a
            a = silu(y[:I]) * y[I:]; z = linear(a, Wd)      reduction, pointwise kernels
            out = x + z                                     and adds between them)
    after:  y = row_gemv(x, W, norm=w)                      one kernel a product
            a = row_gemv(x, W_gate_up, norm=w, act=silu)
            out = row_gemv(a, Wd, residual=x)
            q/k/v's rotary embedding in its product's epilogue (decode_rotary.py)
            a greedy step's token in its head's epilogue (decode_argmax.py), and its
            next inputs written there too, where the target asks
            an attention and o as one launch, where the target asks (attention_o.py)

    before: sdpa(q, cat(past_k, k), cat(past_v, v), mask)   (two copies of the cache,
    after:  decode_attention(q, past_k, k, past_v, v, mask)  SDPA and its reduction)

A decode step reads each weight once and little else, so its speed is how fully each
kernel streams its bytes and how many kernels it launches: the norms, activations, adds
and copies between the products move almost nothing but each costs a launch and a drain
(docs/design-notes.md). Only what is known at capture to be one row
(the decode entry point; a prompt of dynamic length is not) with plain float weights, or
int8 weight-only ones (``--quantize int8-weight``: the kernel reads the int8 rows, half
the bytes, and applies each row's scale to its sum), or int4 rows (``--quantize
int4-weight``: kernels/int4_rows.py's format, a quarter of the bytes, each group's scale
and offset applied to its sums); other linears row_linears.py's reduction.
"""

from __future__ import annotations

import torch
from torch._inductor import inductor_prims
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import attribute, replace_calls, rewrite_and_recapture
from targets.aoti.kernels import int4_rows, ops
from targets.aoti.passes.attention_o import join_attention_with_o
from targets.aoti.passes.attention_store import store_new_rows
from targets.aoti.passes.decode_argmax import advanced_heads, argmax_in_head
from targets.aoti.passes.decode_patterns import (match_decode_attention, match_gated,
                                                 match_int8_linear, match_norm,
                                                 match_residual, unwritten_input, val)
from targets.aoti.passes.decode_rotary import match_rotary
from targets.aoti.passes.decode_stored import stored_once
from targets.aoti.passes.row_linears import _one_row, _plain_float

_LINEAR = torch.ops.aten.linear.default
_ATTENTIONS = (ops.decode_attention, ops.decode_attention_store)  # both take the counts


class RowLinearsAsKernels:
    name = "row_linears_as_kernels"
    required = False

    def __init__(self, attention_o: bool = False, advance_inputs: bool = False,
                 int4: bool = False, int8_x_codes: bool = False) -> None:
        # each attention and o's product after it as one launch where the target asks
        # (Generation.attention_o: passes/attention_o.py); the greedy token's kernel
        # writing the step's next inputs (Generation.advance_inputs: decode_argmax.py);
        # both, and the token in the head, over int4 rows too (Generation.int4_fused);
        # int8 products with the norm folded against x's int8 codes (int8_x_codes)
        self.attention_o = attention_o
        self.advance_inputs = advance_inputs
        self.int4 = int4
        self.int8_x_codes = int8_x_codes

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_and_recapture(
            program, lambda module: _rewrite_linears(module, self.attention_o,
                                                     self.advance_inputs, self.int4,
                                                     self.int8_x_codes),
            "linears_as_kernels")


class DecodeAttentionAsKernel:
    name = "decode_attention_as_kernel"
    required = False

    def __init__(self, store_rows: bool = False) -> None:
        # the new K/V rows stored by the attention's kernel where the target asks
        # (Generation.store_rows: passes/attention_store.py)
        self.store_rows = store_rows

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_and_recapture(
            program, lambda module: _rewrite_attention(module, self.store_rows),
            "attention_as_kernel")


def _rewrite_linears(module: torch.fx.GraphModule, attention_o: bool = False,
                     advance_inputs: bool = False, int4: bool = False,
                     int8_x_codes: bool = False) -> dict:
    counts = {"linears_as_kernels": 0, "int8_linears": 0, "int4_linears": 0,
              "norms_folded": 0, "gated_folded": 0, "residuals_folded": 0, "rotary_folded": 0}
    # export's dtype asserts (of the model's and torchao's .to() calls) are extra uses of
    # the nodes fused here, and check nothing a compiled library keeps (Inductor drops them)
    for node in list(module.graph.nodes):
        if node.target is torch.ops.aten._assert_tensor_metadata.default:
            module.graph.erase_node(node)
    for node in list(module.graph.nodes):
        product = _product(module, node)
        if product is None:
            continue
        x, weight, bias, scale, node = product
        norm = match_norm(x) if isinstance(x, torch.fx.Node) else None
        if norm is not None and val(norm.hidden).shape[-1] != val(x).shape[-1]:
            norm = None
        gated = match_gated(node)
        last, act = gated if gated else (node, 0)
        residual = match_residual(last)
        replaced, extra = residual if residual else (last, None)
        rotary = match_rotary(replaced) if not (act or residual) else None
        turn = (rotary.cos, rotary.sin, rotary.rows, rotary.head_dim) if rotary else ()
        with module.graph.inserting_before(replaced):
            fused = module.graph.call_function(ops.row_gemv, (
                norm.hidden if norm else x, weight, bias, norm.weight if norm else None,
                extra, norm.eps if norm else 0.0, norm.offset if norm else 0.0, act, scale,
                *turn))
        fused.meta = dict(replaced.meta)
        replaced.replace_all_uses_with(fused)
        for rotated, heads in rotary.replaced if rotary else ():
            rotated.replace_all_uses_with(heads)  # the op's rows are rotated already
        counts["linears_as_kernels"] += 1
        counts["int8_linears"] += scale is not None and val(weight).dtype == torch.int8
        counts["int4_linears"] += val(weight).dtype == torch.uint8
        counts["norms_folded"] += norm is not None
        counts["gated_folded"] += gated is not None
        counts["residuals_folded"] += residual is not None
        counts["rotary_folded"] += rotary is not None
    if int8_x_codes:  # the choice is made only where asked: the key stays absent otherwise
        counts["int8_x_codes"] = _x_codes(module)
    # the token a greedy step returns, taken in its head's kernel (decode_argmax.py)
    counts["argmax_in_head"] = argmax_in_head(module, advance_inputs, int4)
    if advance_inputs:  # the same: asked for, it is counted
        counts["inputs_advanced"] = advanced_heads(module)
    counts["split_counts"] = _split_counts(module)
    counts["stored_once"] = stored_once(module, ops.row_gemv, (9, 10))  # cos, sin
    module.graph.eliminate_dead_code()  # the linears replaced: o alone reads its row
    if attention_o:  # the choice is made only where asked: the key stays absent otherwise
        counts["attention_o"] = join_attention_with_o(module, int4)
    module.recompile()
    return counts


X_QBLOCK = 32  # x's int8 codes a scale: llama.cpp's q8_1 blocks, for the same reason


def _x_codes(module: torch.fx.GraphModule) -> int:
    """Each row_gemv over int8 rows with their scales and the norm folded (q/k/v,
    gate/up, the head: its token kernel takes it along) reads x as int8 codes in blocks of
    X_QBLOCK columns, four products a dp4a (kernels/int8_dot4_triton.py); returns how
    many. o's and down's launches keep float x."""
    found = 0
    for node in module.graph.nodes:
        if node.op != "call_function" or node.target is not ops.row_gemv:
            continue
        weight, norm_weight, scale = node.args[1], node.args[3], node.args[8:9]
        if (norm_weight is not None and scale and scale[0] is not None
                and val(weight).dtype == torch.int8 and val(weight).shape[-1] % X_QBLOCK == 0):
            node.update_kwarg("x_qblock", X_QBLOCK)
            found += 1
    return found


def _product(module: torch.fx.GraphModule, node: torch.fx.Node) -> tuple | None:
    """A one-row product the kernel takes: (x, weight, bias, scales: int8 rows' per row,
    int4 rows' per group, or None, the node standing for its output)."""
    if _row_linear(module, node):
        bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        return node.args[0], node.args[1], bias, None, node
    if node.op == "call_function" and node.target is int4_rows.int4_linear \
            and _one_row(node):  # int4 rows: the kernel reads the packed rows as stored
        x, packed, scales, *bias = node.args
        return x, packed, bias[0] if bias else None, scales, node
    found = match_int8_linear(node)
    if found is None or not _one_row(node):
        return None
    return found.x, found.weight, found.bias, found.scale, found.out


def _split_counts(module: torch.fx.GraphModule) -> int:
    """The step's int8 products that a dependent launch may split along K (no norm, gate
    or rotary rows: kernels/split_gemv_triton.py) get its one buffer of join counters,
    the attentions' (their kernels and the split one leave it at zero, and run one after
    another): a new one, a count for every row of the largest product (enough for any
    block of rows) and every key/value head, stored once. Returns how many got it."""
    readers = [n for n in module.graph.nodes if n.op == "call_function" and (
        n.target in _ATTENTIONS and len(n.args) > 8 or
        n.target is ops.row_gemv and _splittable(n))]
    products = [n for n in readers if n.target is ops.row_gemv]
    if not products:
        return 0
    size = max(val(n.args[1 if n.target is ops.row_gemv else 8]).shape[0] for n in readers)
    first = val(readers[0].args[0])
    with module.graph.inserting_before(readers[0]):
        zeros = module.graph.call_function(torch.ops.aten.zeros.default, ([size],), {
            "dtype": torch.int32, "device": first.device})
        zeros.meta["val"] = first.new_zeros((size,), dtype=torch.int32)
        # one stored buffer, not a fill of each reader's own (decode_stored.py)
        counts = module.graph.call_function(inductor_prims.force_stride_order, (zeros, [1]))
        counts.meta = dict(zeros.meta)
    for node in readers:
        if node.target in _ATTENTIONS:
            node.update_arg(8, counts)
        else:  # no rotary rows: their arguments at their defaults
            node.args = (*node.args[:9], None, None, 0, 0, counts)
    return len(products)


def _splittable(node: torch.fx.Node) -> bool:
    """A row_gemv over int8 rows with their scales, no norm, gate or rotary rows."""
    args = node.args
    weight = val(args[1])
    return (weight is not None and weight.dtype == torch.int8 and args[8] is not None
            and args[3] is None and not args[7] and len(args) <= 9)


def _row_linear(module: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """A linear of one row over a plain float weight (and bias), all of one dtype."""
    if not (node.op == "call_function" and node.target is _LINEAR and _one_row(node)):
        return False
    weight = attribute(module, node.args[1])
    bias_node = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    bias = attribute(module, bias_node)
    x = val(node.args[0])
    return (_plain_float(weight) and x is not None and x.dtype == weight.dtype
            and (bias_node is None or (bias is not None and bias.dtype == weight.dtype)))


def _rewrite_attention(module: torch.fx.GraphModule, store_rows: bool = False) -> dict:
    ahead = []

    def arguments(node):
        found = match_decode_attention(node)
        if found is None:
            return None
        # the past rows no op of the step writes: read before the kernel's wait
        ahead.append(unwritten_input(found.past_k) and unwritten_input(found.past_v))
        return ((found.query, found.past_k, found.new_k, found.past_v, found.new_v,
                 found.mask, found.scale, ahead[-1]), {})
    # SDPA is tagged random (its dropout), so dead-code elimination would keep it, and
    # with it the cache copies it reads: replace_calls erases it
    info = replace_calls(module, arguments, ops.decode_attention, "attention_as_kernel")
    info["cache_ahead"] = sum(ahead)
    _shared_counts(module)
    # the mask and the counts
    info["stored_once"] = stored_once(module, ops.decode_attention, (5, 8))
    module.graph.eliminate_dead_code()  # the cache copies SDPA read: not readers now
    if store_rows:  # the choice is made only where asked: the key stays absent otherwise
        info["rows_stored"] = store_new_rows(module)
    module.recompile()
    return info


def _shared_counts(module: torch.fx.GraphModule) -> None:
    """One int32 zeros buffer, a count for each key/value head, given to every attention:
    its kernel joins its blocks itself and leaves the counts at zero, so the step fills
    them once for all layers (a buffer of each op's own is a fill kernel a layer)."""
    attentions = [n for n in module.graph.nodes
                  if n.op == "call_function" and n.target is ops.decode_attention]
    if not attentions:
        return
    first = val(attentions[0].args[0])
    size = max(val(n.args[1]).shape[1] for n in attentions)
    with module.graph.inserting_before(attentions[0]):
        counts = module.graph.call_function(torch.ops.aten.zeros.default, ([size],), {
            "dtype": torch.int32, "device": first.device})
    counts.meta["val"] = first.new_zeros((size,), dtype=torch.int32)
    for node in attentions:
        node.args = (*node.args, counts)
