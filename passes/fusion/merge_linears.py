"""Merge parallel linears that read the same input (Q, K, V) into one matmul and a split.

    before: q = linear(x, Wq, bq); k = linear(x, Wk, bk); v = linear(x, Wv, bv)
    after:  qkv = linear(x, cat(Wq, Wk, Wv), cat(bq, bk, bv)); q, k, v = split(qkv, [nq, nk, nv])

One larger GEMM uses the machine better than three small ones and reads x once.
"""

from __future__ import annotations

import operator
from collections import defaultdict

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.in_place import rewrite_in_place
from passes.graph.rewrite import add_constant, attribute, module_path, set_module_path

_LINEAR = torch.ops.aten.linear.default


class MergeParallelLinears:
    name = "merge_parallel_linears"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_in_place(program, _merge_all, "linears_merged")


def _merge_all(module: torch.fx.GraphModule) -> dict:
    groups: dict[torch.fx.Node, list[torch.fx.Node]] = defaultdict(list)
    for node in module.graph.nodes:
        if node.op == "call_function" and node.target is _LINEAR and not node.kwargs \
                and isinstance(node.args[0], torch.fx.Node) \
                and attribute(module, node.args[1]) is not None \
                and not _written_in_place(node):
            groups[node.args[0]].append(node)
    merged = groups_merged = 0
    for linears in groups.values():
        weights = [attribute(module, n.args[1]) for n in linears]
        if len(linears) < 2 or len({(w.shape[1], w.dtype) for w in weights}) != 1:
            continue
        _merge(module, linears, weights)
        merged += len(linears)
        groups_merged += 1
    module.recompile()
    return {"linears_merged": merged, "groups": groups_merged}


def _written_in_place(node: torch.fx.Node) -> bool:
    """Whether an op writes into the linear's output (OLMo's ``clamp_`` of q, k and v
    under ``clip_qkv``): a piece of the merged output is a view of the split, which autograd
    refuses to have written in place, so such a linear stays alone."""
    for user in node.users:
        schema = getattr(user.target, "_schema", None)
        if schema is None or not schema.is_mutable:
            continue
        given = dict(zip((a.name for a in schema.arguments), user.args)) | dict(user.kwargs)
        if any(a.alias_info is not None and a.alias_info.is_write and given.get(a.name) is node
               for a in schema.arguments):
            return True
    return False


def _merge(module: torch.fx.GraphModule, linears: list[torch.fx.Node],
           weights: list[torch.Tensor]) -> None:
    given = [attribute(module, n.args[2]) if len(n.args) > 2 and n.args[2] is not None
             else None for n in linears]
    # zeros where some linears have a bias; none at all where none has (a bias of zeros
    # is one more Add per layer on targets that do not fold it: LLaMA's q/k/v, gate/up)
    biases = [b if b is not None else torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
              for b, w in zip(given, weights)]
    # The merged linear must come after every operand and before every user: put it
    # right before the first of the linears (groups are collected in graph order; their
    # common input x is above all of them).
    first = linears[0]
    weight = add_constant(module, f"{first.name}_merged_weight", torch.cat(weights), first)
    bias = (add_constant(module, f"{first.name}_merged_bias", torch.cat(biases), first)
            if any(b is not None for b in given) else None)
    with module.graph.inserting_before(first):
        fused = module.graph.call_function(_LINEAR, (first.args[0], weight, bias))
        parts = module.graph.call_function(torch.ops.aten.split_with_sizes.default,
                                           (fused, [w.shape[0] for w in weights], -1))
        for index, linear in enumerate(linears):
            piece = module.graph.call_function(operator.getitem, (parts, index))
            piece.meta = dict(linear.meta)
            linear.replace_all_uses_with(piece)
    fused.meta = dict(first.meta)
    set_module_path(fused, merged_path([module_path(n) for n in linears]))
    for linear in linears:
        module.graph.erase_node(linear)


def merged_path(paths: list[str]) -> str:
    """One label for a merged linear: "layers.0.self_attn.q_proj+k_proj+v_proj" where the
    modules share a parent, else the paths joined."""
    parents = {path.rpartition(".")[0] for path in paths}
    if len(parents) == 1 and all(paths):
        parent = parents.pop()
        return (f"{parent}." if parent else "") + "+".join(p.rpartition(".")[2] for p in paths)
    return "+".join(p for p in paths if p)
