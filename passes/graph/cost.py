"""What each op of a program costs, from the graph alone: FLOPs and the weight bytes it
reads, for the report's per-layer table (``exporter report``).

FLOPs are torch's own formulas (``torch.utils.flop_counter.FlopCounterMode``, the counter
``torch.profiler`` uses): each node is called again on meta tensors of its recorded
shapes, so a composite op (``aten.linear``) is counted through what it dispatches to
(``addmm``). Only matrix products, convolutions and attention have formulas; elementwise
ops, norms and reductions count 0. Dynamic dims take their example size (the size hint),
so the figures are at the example inputs' shapes.

Weight bytes: the parameters, buffers and constants a node reads, directly or through
ops that read only weights (a transpose, a dequantize of an int8 weight), at their stored
dtype. A weight shared by two ops (tied embeddings) counts in both.
"""

from __future__ import annotations

import logging

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx import Node
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from passes.graph.ops import is_custom_op
from passes.graph.rewrite import module_path

log = logging.getLogger(__name__)

FLOPS_AT = "the example inputs' shapes"
_WEIGHT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def op_costs(program: ExportedProgram) -> dict[str, dict]:
    """Call node name -> ``{"flops": int | None, "weight_bytes": int, "module": str}``
    (``flops`` None: the op could not run on meta tensors, a custom op without a fake
    kernel say; ``module``: the innermost nn.Module path that called it, "" at the top)."""
    weights = _weight_sizes(program)
    weight_only: set[Node] = set(weights)  # weights, and ops that read nothing else
    reached: dict[Node, frozenset[Node]] = {w: frozenset([w]) for w in weights}
    costs = {}
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        inputs = node.all_input_nodes
        read = frozenset().union(*(reached[arg] for arg in inputs if arg in weight_only))
        # an op of weights alone (a transpose, a dequantize) passes them on; the op that
        # meets an activation pays for them
        passes_on = bool(inputs) and all(arg in weight_only for arg in inputs)
        if passes_on:
            weight_only.add(node)
            reached[node] = read
        costs[node.name] = {"flops": _flops(node),
                            "weight_bytes": 0 if passes_on else sum(weights[w] for w in read),
                            "module": module_path(node)}
    return costs


def _weight_sizes(program: ExportedProgram) -> dict[Node, int]:
    by_name = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    sizes = {}
    for spec in program.graph_signature.input_specs:
        if spec.kind not in _WEIGHT_KINDS or spec.arg.name not in by_name:
            continue
        tensor = program.state_dict.get(spec.target)
        if tensor is None:
            tensor = program.constants.get(spec.target)
        if isinstance(tensor, torch.Tensor):
            sizes[by_name[spec.arg.name]] = _stored_bytes(tensor)
    return sizes


def _stored_bytes(tensor: torch.Tensor) -> int:
    """Bytes as stored; a tensor subclass (torchao's int8 weights) by its inner tensors."""
    inner = getattr(tensor, "__tensor_flatten__", None)
    if inner is not None and type(tensor) is not torch.Tensor and \
            type(tensor) is not torch.nn.Parameter:
        names, _ = inner()
        return sum(_stored_bytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()


def _flops(node: Node) -> int | None:
    """torch's FLOP formulas on meta tensors of the node's example shapes."""
    def meta(arg):
        if isinstance(arg, Node):
            value = arg.meta.get("val")
            if isinstance(value, torch.Tensor):
                return torch.empty([_hint(s) for s in value.shape], dtype=value.dtype,
                                   device="meta")
            return _hint(value) if isinstance(value, torch.SymInt) else value
        return arg
    if isinstance(node.target, torch._ops.HigherOrderOperator):
        return None  # its body is a subgraph, not meta tensors; and it may set grad mode
    try:
        args, kwargs = tree_map(meta, (node.args, node.kwargs))
        # no_grad restores the caller's grad mode on the way out, whatever the op did to it
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            node.target(*args, **kwargs)
        return int(counter.get_total_flops())
    except Exception as exc:  # noqa: BLE001 - any op may refuse meta tensors
        log.debug("no FLOP count for %s (%s): %s", node.name, node.target, exc)
        return None if _may_have_flops(node.target) else 0


def _may_have_flops(target) -> bool:
    """Whether torch has a formula for the op or for what it may decompose into (an op
    that is neither, ``_to_copy`` refusing a meta tensor say, does no matrix math)."""
    if not isinstance(target, torch._ops.OpOverload) or is_custom_op(target):
        return True  # a Python callable or a custom op: its insides are unknown
    return target.overloadpacket in flop_registry or target._can_decompose()


def _hint(size) -> int:
    return int(size.node.hint) if isinstance(size, torch.SymInt) else int(size)
