"""Remove ops that compute nothing at inference, and fold weight-only computations.

    before: y = dropout(x, 0.1, train=False); z = clone(y); w = transpose(transpose(z, 1, 2), 1, 2)
    after:  w = x
    before: t = transpose(W, 0, 1)  (W a stored weight read nowhere else); y = matmul(x, t)
    after:  y = matmul(x, W_t)      (W_t stored already transposed)

Constants are folded only when every weight they read is used by nothing else, so
folding never stores a tensor twice (a tied embedding's transpose stays computed), or when
they are small (a model's scalar settings: Gemma 3n's sparsity threshold, ``Normal(0,
1).icdf(0.95)``, whose erf_inv ONNX has no op for and which ran on the CPU fallback).

Nothing an in-place op writes (or a view of it) is folded or lost to a removed copy: a
folded ``linear`` under ``relu_`` made the stored constant what ``relu_`` mutates, a buffer
ExecuTorch then ships without its values (Swinv2's position-bias MLP).
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.in_place import rewrite_in_place
from passes.graph.rewrite import add_constant, attribute

aten = torch.ops.aten
_IDENTITIES = {aten.clone.default, aten.contiguous.default, aten.alias.default,
               aten.detach.default, aten.lift_fresh_copy.default}
# in place, but only on autograd's state: what it returns is its input (torch.distributions
# detach their arguments: Gemma 3n's Normal(0, 1).icdf)
_DETACHES = {aten.detach_.default}
_DROPOUTS = {aten.dropout.default, aten.feature_dropout.default, aten.alpha_dropout.default}
_SELF_INVERSE = {aten.transpose.int}
# Never folded: reading them at build time is not what they mean.
_NOT_FOLDABLE = {aten.empty.memory_format, aten.rand.default, aten.randn.default,
                 aten._assert_tensor_metadata.default}


class RemoveNoOps:
    name = "remove_noops"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_in_place(program, _remove_all, "nodes_removed")


def _remove_all(module: torch.fx.GraphModule) -> dict:
    graph = module.graph
    before = _ops(graph)
    written = _written(graph)
    for node in list(graph.nodes):
        source = _passthrough(node)
        if source is not None and not _touched(node, written) \
                and not _touched(source, written):
            node.replace_all_uses_with(source)
            graph.erase_node(node)  # fx's dead-code pass keeps random ops such as dropout
    graph.eliminate_dead_code()
    folded = _fold_constants(module)
    graph.eliminate_dead_code()
    module.recompile()
    return {"nodes_removed": before - _ops(graph), "constants_folded": folded}


def _ops(graph: torch.fx.Graph) -> int:
    return sum(n.op == "call_function" for n in graph.nodes)


def _passthrough(node: torch.fx.Node) -> torch.fx.Node | None:
    """The node's input when the node returns it unchanged, else None."""
    if node.op != "call_function" or not node.args:
        return None
    source = node.args[0]
    if node.target in _IDENTITIES and not node.kwargs.get("memory_format") \
            and _contiguous(source):
        # clone/contiguous of a transposed tensor is what makes a later view() legal
        # (attention's transpose -> contiguous -> view); only a copy of an already
        # contiguous tensor is a no-op.
        return source
    if node.target in _DETACHES:
        return source
    if node.target in _DROPOUTS and (len(node.args) > 2 and node.args[2] is False
                                     or node.args[1] == 0):
        return source
    if node.target in _SELF_INVERSE and isinstance(source, torch.fx.Node) \
            and source.target is node.target and _same_dims(source.args[1:], node.args[1:]):
        return source.args[0]
    if node.target is aten.to.dtype and _dtype(source) == node.args[1] and not node.kwargs:
        return source
    return None


def _written(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Nodes an in-place or out= op writes into, with the views and in-place results
    they alias back to their base."""
    written: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) \
                or node.target in _DETACHES:  # writes autograd's state only
            continue
        for index, argument in enumerate(node.target._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = node.args[index] if index < len(node.args) \
                else node.kwargs.get(argument.name)
            for target in value if isinstance(value, (list, tuple)) else [value]:
                _mark(target, written)
    return written


def _mark(node: object, written: set) -> None:
    while isinstance(node, torch.fx.Node) and node not in written:
        written.add(node)
        node = _alias_base(node)


def _alias_base(node: torch.fx.Node) -> torch.fx.Node | None:
    """The input a view (or an in-place op's result) shares memory with, else None."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) \
            or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    returns = node.target._schema.returns
    return node.args[0] if returns and returns[0].alias_info is not None else None


def _touched(node: torch.fx.Node | None, written: set) -> bool:
    """Whether an in-place op writes this node's memory, through it or its bases."""
    while node is not None:
        if node in written:
            return True
        node = _alias_base(node)
    return False


def _contiguous(node: object) -> bool:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(value, torch.Tensor) and value.is_contiguous()


def _same_dims(a, b) -> bool:
    return sorted(a) == sorted(b)


def _dtype(node: object):
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value.dtype if isinstance(value, torch.Tensor) else None


# A tensor this small may be stored twice (folded for one reader, kept for another), and a
# constructor making one from literals (scalar_tensor(0.95)) is folded too.
SMALL_ELEMENTS = 64


def _fold_constants(module: torch.fx.GraphModule) -> int:
    """Replace ops whose inputs are all stored tensors read by nothing else (or small),
    and small tensors made from literals alone."""
    folded = 0
    written = _written(module.graph)  # a folded result or weight an op writes into stays
    readers: dict[str, int] = {}  # weight name -> ops reading it, over all its get_attrs
    for node in module.graph.nodes:
        if node.op == "get_attr":
            readers[node.target] = readers.get(node.target, 0) + len(node.users)
    for node in list(module.graph.nodes):
        if node.op != "call_function" or node.target in _NOT_FOLDABLE \
                or not isinstance(node.target, torch._ops.OpOverload) \
                or node.target._schema.is_mutable \
                or torch.Tag.nondeterministic_seeded in node.target.tags \
                or node in written or any(_touched(n, written) for n in node.all_input_nodes):
            continue
        inputs = node.all_input_nodes
        values = [attribute(module, n) for n in inputs]
        stored_once_or_small = all(v is not None and (readers.get(n.target, 0) <= 1 or _small(v))
                                   for n, v in zip(inputs, values))
        if not stored_once_or_small or not inputs and not _small(node.meta.get("val")):
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs),
                                             lambda n: values[inputs.index(n)])
        with torch.no_grad():
            result = node.target(*args, **kwargs)
        if not isinstance(result, torch.Tensor) or not inputs and not _small(result):
            continue
        constant = add_constant(module, f"{node.name}_folded", result.contiguous(), node)
        readers[constant.target] = len(node.users)
        node.replace_all_uses_with(constant)
        folded += 1
    return folded


def _small(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.numel() <= SMALL_ELEMENTS
