"""A greedy decode step's token taken inside its head's kernel.

    before: logits = row_gemv(h, W_head, norm=w)          the head, then torch's argmax:
            token = argmax(logits[0, -1:], -1)              a reduction over the vocabulary,
                                                            a plain launch after the head
    after:  logits, token = row_gemv_argmax(h, W_head, norm=w)

A step that returns its next token (exporter/lm/wrapper.py's ``next_token``) takes the
argmax of its one row of logits; the head's kernel computes those logits, so each of its
programs also merges its rows' (max, first index) into one slot, which a one-thread
kernel after it turns into the token (kernels/head_argmax_triton.py). Only a head without residual, gate
or rotary rows, of float or int8 rows (int4 rows too where the target asks:
``Generation.int4_fused``), whose argmax reads its whole row unchanged (views of it,
widening casts); anything else keeps torch's argmax.

Where the target asks (``Generation.advance_inputs``), the token kernel of a one-token
step also writes the token into the step's ``input_ids`` and adds one to its
``positions`` (``row_gemv_argmax_advance``, an op that says it mutates them): the decode
graph's greedy loop feeds those inputs back as they are, so its copy of the token and its
add, two plain launches after the step, are gone (runtime/generation/decode_graph.py).
"""

from __future__ import annotations

import operator

import torch
from targets.aoti.kernels import ops
from targets.aoti.passes.attention_store import step_inputs
from targets.aoti.passes.decode_patterns import calls, val

aten = torch.ops.aten
_GUARDS = "_guards_fn"
_ARGMAX = aten.argmax.default
# ops whose output holds the same elements in the same order, for a tensor of one row
_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default,
          aten.select.int, aten.slice.Tensor, aten.squeeze.dim, aten.squeeze.dims,
          aten.squeeze.default, aten.unsqueeze.default, aten.alias.default}
_CASTS = {aten._to_copy.default, aten.to.dtype, torch.ops.prims.convert_element_type.default}


def argmax_in_head(module: torch.fx.GraphModule, advance: bool = False,
                   int4: bool = False) -> int:
    """Each argmax over a head row_gemv's whole row becomes that product's token; returns
    how many (a step has one head). With ``advance`` (``module``: the unlifted one-token
    step), the head's token kernel also writes the token into the step's input ids and
    adds one to its positions, where every other reader of those inputs comes before the
    head, so each reads them as given (``advanced_heads`` counts them). ``int4``: a head
    over int4 rows too."""
    found = 0
    for node in list(module.graph.nodes):
        head = _head_of(node, int4) if calls(node, _ARGMAX) else None
        if head is None:
            continue
        inputs = _advanced_inputs(module, head) if advance and not advanced_heads(
            module) else None
        _fuse(module, head, node, inputs)
        found += 1
    return found


def advanced_heads(module: torch.fx.GraphModule) -> int:
    return sum(calls(node, ops.row_gemv_argmax_advance) for node in module.graph.nodes)


def _advanced_inputs(module: torch.fx.GraphModule, head: torch.fx.Node) -> tuple | None:
    """(input ids, positions) of the step whose head ``head`` is, where no reader of
    either comes after it (the output included), else None."""
    inputs = step_inputs(module)
    if inputs is None:
        return None
    order = {node: i for i, node in enumerate(module.graph.nodes)}
    # export's input guards (an unlifted module's ``_guards_fn``) check shapes only
    readers = [user for value in inputs for user in value.users
               if not (user.op == "call_module" and user.target == _GUARDS)]
    return inputs if all(order[user] < order[head] for user in readers) else None


def _head_of(argmax: torch.fx.Node, int4: bool) -> torch.fx.Node | None:
    """The row_gemv whose one row of logits ``argmax`` reads in full, else None."""
    source, dim = argmax.args[0], argmax.args[1] if len(argmax.args) > 1 else None
    read = val(source)
    node = source
    while calls(node, *_VIEWS) or _widening(node):
        node = node.args[0]
    logits = val(node)
    if not (calls(node, ops.row_gemv) and logits is not None and read is not None):
        return None
    width = logits.shape[-1]
    weight, residual, act = node.args[1], node.args[4], node.args[7]
    whole_row = logits.numel() == width == read.numel() and (
        dim is None or read.shape[dim] == width)
    # no rotary rows or join counts: arguments past the scales
    plain_head = residual is None and not act and len(node.args) <= 9
    rows = val(weight)
    # int4 rows (uint8) only where asked: the kernel's A/B on a real build decides
    kind = rows is not None and (int4 or rows.dtype != torch.uint8)
    return node if whole_row and plain_head and kind else None


def _widening(node) -> bool:
    """A cast to a float type that holds every value of its input exactly."""
    if not calls(node, *_CASTS):
        return False
    before, after = val(node.args[0]), val(node)
    # a wider float type holds every fp16, bf16 or fp32 value; fp16 <-> bf16 does not
    return (before is not None and after is not None and before.is_floating_point()
            and after.is_floating_point() and (after.dtype == before.dtype or
                                               after.element_size() > before.element_size()))


def _fuse(module: torch.fx.GraphModule, head: torch.fx.Node, argmax: torch.fx.Node,
          advance: tuple | None) -> None:
    graph = module.graph
    x, weight, bias, norm, _, eps, offset, _, *rest = head.args
    scale = rest[0] if rest else None
    logits = val(head)
    with graph.inserting_before(head):
        fused = graph.call_function(
            ops.row_gemv_argmax_advance if advance else ops.row_gemv_argmax,
            (x, weight, bias, norm, eps, offset, scale, *(advance or ())),
            {k: v for k, v in head.kwargs.items() if k == "x_qblock"})  # x's int8 codes
        token = logits.new_empty((1,), dtype=torch.int64)
        fused.meta = {**head.meta, "val": (logits, token)}
        values = graph.call_function(operator.getitem, (fused, 0))
        values.meta = dict(head.meta)
        chosen = graph.call_function(operator.getitem, (fused, 1))
        chosen.meta["val"] = token
    head.replace_all_uses_with(values)
    wanted = val(argmax)
    if wanted is not None and tuple(wanted.shape) != (1,):
        with graph.inserting_before(argmax):
            chosen = graph.call_function(aten.reshape.default, (chosen, list(wanted.shape)))
        chosen.meta["val"] = wanted
    argmax.replace_all_uses_with(chosen)
    graph.erase_node(argmax)
    graph.erase_node(head)
