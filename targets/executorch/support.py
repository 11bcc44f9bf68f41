"""What ExecuTorch can run, read from ExecuTorch itself: the XNNPACK partitioner's configs
(the ops it delegates, and their dtype rule) and the kernel registry of the runtime in
the wheel (``_get_operator_names``: the portable/optimized kernels, by out variant).

An ATen op reaches the runtime as ExecuTorch's edge lowering leaves it: view ops become
their ``_copy`` variant, ``_to_copy``/``clone``/``empty`` their dim-order twins, and each
functional op its ``.out`` kernel. An op neither XNNPACK nor a kernel takes is refused,
with the reason, and runs on our CPU fallback.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import operator
import sys

import torch
from torch.fx import Node

from passes.graph.ops import is_custom_op
from targets.executorch.xnnpack_guards import refusal

log = logging.getLogger(__name__)

# Runtime checks ExecuTorch's edge passes remove (RemoveGraphAssertsPass and
# RemoveNonCoreAtenOpGraphAssertsPass): no kernel runs them.
CHECKS = frozenset({
    "aten::_assert_async.msg", "aten::_assert_scalar", "aten::sym_constrain_range_for_size",
    "aten::sym_constrain_range", "aten::_assert_tensor_metadata",
})
# Where quantize/dequantize nodes come from: PT2E's and torchao's (8da4w).
_QUANT_NAMESPACES = frozenset({"quantized_decomposed", "torchao"})
# SymInt arithmetic on sizes runs as executorch_prim kernels of the same name.
_PRIM_FUNCTIONS = {operator.add: "add", operator.sub: "sub", operator.mul: "mul",
                   operator.floordiv: "floordiv", operator.truediv: "truediv",
                   operator.mod: "mod", operator.neg: "neg", operator.eq: "eq",
                   operator.gt: "gt", operator.lt: "lt", operator.ge: "ge", operator.le: "le"}


@functools.cache
def installed() -> bool:
    return importlib.util.find_spec("executorch") is not None


@functools.cache
def kernel_names() -> frozenset[str]:
    """'aten::add.out', 'dim_order_ops::_to_dim_order_copy.out', ...: the kernels the
    wheel's runtime registers (the same runtime that validates the build), with its
    quantized_decomposed kernels (--quantize's q/dq outside a delegate)."""
    import executorch.kernels.quantized  # noqa: F401 - registers them
    from executorch.extension.pybindings import portable_lib
    return frozenset(portable_lib._get_operator_names())


@functools.cache
def xnnpack_configs() -> dict[str, object]:
    """Edge op name ('convolution.default') -> the XNNPACK partitioner config that
    claims it (an instance: its dtype rule is read per node)."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    configs = {}
    for config in ALL_PARTITIONER_CONFIGS:
        made = config()
        configs.setdefault(made.target_name, made)
    return configs


@functools.cache
def kept_for_xnnpack() -> frozenset:
    """ATen ops XNNPACK asks ExecuTorch not to decompose (linear, hardswish, ...)."""
    return frozenset(op for config in xnnpack_configs().values()
                     if (op := config.get_original_aten()) is not None)


def decomposition_table() -> dict:
    """ExecuTorch's own edge decomposition table, less the ops XNNPACK keeps whole: what
    ``to_edge_transform_and_lower`` applies before it partitions."""
    from executorch.exir.tracer import _default_decomposition_table
    table = _default_decomposition_table()
    for op in kept_for_xnnpack():
        table.pop(op, None)
    return table


@functools.cache
def _edge_form(op: torch._ops.OpOverload) -> torch._ops.OpOverload:
    """The op as the edge lowering leaves it (view -> view_copy, memory format -> dim order)."""
    from executorch.exir.passes.dim_order_ops_registry import DimOrderOpsMap
    from torch._export.error import InternalError
    from torch._export.passes.replace_view_ops_with_view_copy_ops_pass import (
        _NON_FUNCTIONAL_OPS_TO_FUNCTIONAL_OPS,
        get_view_copy_of_view_op,
    )
    if op in _NON_FUNCTIONAL_OPS_TO_FUNCTIONAL_OPS:
        return _NON_FUNCTIONAL_OPS_TO_FUNCTIONAL_OPS[op]
    try:
        copy = get_view_copy_of_view_op(op._schema)
    except InternalError:  # a view op with no copy twin: it stays as it is
        copy = None
    op = copy or op
    dim_order = {edge._op: twin._op for edge, twin in DimOrderOpsMap.items()}
    return dim_order.get(op, op)


@functools.cache
def kernel_for(op: torch._ops.OpOverload) -> str | None:
    """The registered kernel that runs ``op`` after the edge lowering, or None."""
    names = kernel_names()
    edge = _edge_form(op)
    if edge.name() in names:  # sym_size.int, _local_scalar_dense: registered as they are
        return edge.name()
    out = _executorch_out_variant(edge)
    if out in names:
        return out
    wanted = _plain_arguments(edge._schema)
    packet = getattr(getattr(torch.ops, edge.namespace), edge._schema.name.split("::")[1])
    for overload in packet.overloads():  # the out variant: same arguments, plus out=
        schema = getattr(packet, overload)._schema
        out = [a for a in schema.arguments if a.is_out]
        if out and _plain_arguments(schema) == wanted:
            name = f"{schema.name}.{overload}" if overload != "default" else schema.name
            if name in names:
                return name
    return None


def _executorch_out_variant(op: torch._ops.OpOverload) -> str | None:
    """ExecuTorch's own functional -> out mapping (its emitter's), or None."""
    from executorch.exir.operator.convert import to_out_variant
    try:
        return to_out_variant(op)[0].name()
    # it asserts on some packets (pow's int_to_int) and trips on ops without a native
    # schema (CompositeImplicit ones placement may ask about before decomposition)
    except (RuntimeError, AssertionError, AttributeError):
        return None


def _plain_arguments(schema) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments if not a.is_out]


def xnnpack_takes(node: Node) -> str | None:
    """The XNNPACK config that delegates this node (by the op's edge form, the config's
    dtype rule and its constraints on the node's own arguments), or None."""
    config = xnnpack_configs().get(_edge_form(node.target).__name__)
    if config is None or not config._check_node_has_valid_dtype(node) or refusal(node) \
            or constraint_refusal(config, node):
        return None
    return type(config).__name__


class _NeedsProgram(Exception):
    """A config's constraint read the exported program: not decidable from the node."""


class _NoProgram:
    def __getattr__(self, name: str):
        raise _NeedsProgram(name)


def constraint_refusal(config, node: Node) -> str | None:
    """XNNPACK's reason for refusing this node by its arguments (``ceil_mode`` pooling,
    an add's alpha, ...), or None. Constraints that read the program's weights are left
    to the partitioner: the build's placement records what it decided."""
    try:
        if config.check_constraints(node, _NoProgram()):
            return None
    except Exception as exc:  # any constraint ExecuTorch cannot judge without the program
        log.debug("XNNPACK's %s constraint on %s needs the program: %r",
                  type(config).__name__, node.name, exc)
        return None
    why = getattr(sys.modules.get(type(config).__module__), "why", None)
    reason = why.reason if why is not None and why.node is node else "its constraints"
    return f"XNNPACK's {type(config).__name__} refuses it: {reason}"


def _quantizes_for(node: Node, depth: int = 4) -> str | None:
    """The XNNPACK config of the op a quantize/dequantize/choose_qparams node feeds
    (through the q/dq chain): XNNPACK's partitioner takes such nodes with that op."""
    for user in node.users:
        if user.op != "call_function":
            continue
        target = user.target
        if target is operator.getitem or getattr(target, "namespace", "") in _QUANT_NAMESPACES:
            found = _quantizes_for(user, depth - 1) if depth else None
        else:
            found = xnnpack_takes(user) if isinstance(target, torch._ops.OpOverload) else None
        if found:
            return found
    return None


def decide(node: Node) -> tuple[bool, str]:
    """(supported, reason) for one node; the reason says where it runs: "XNNPACK
    delegate (its config)" or "portable kernel (its name)"."""
    op = node.target
    if op is operator.getitem:
        return True, "tuple element (no kernel)"
    if not isinstance(op, torch._ops.OpOverload):
        name = _PRIM_FUNCTIONS.get(op) or getattr(op, "__name__", str(op))
        kernel = next((k for k in (f"executorch_prim::{name}.Scalar",
                                   f"executorch_prim::{name}.int") if k in kernel_names()), None)
        if kernel:
            return True, f"portable kernel {kernel} (size arithmetic)"
        return False, f"{name}: no ExecuTorch kernel (a higher-order or Python op)"
    if op.name() in CHECKS:
        return True, "runtime check; ExecuTorch's edge passes remove it"
    config = xnnpack_takes(node)
    if config is not None:
        return True, f"XNNPACK delegate ({config})"
    if op.namespace in _QUANT_NAMESPACES and (config := _quantizes_for(node)):
        return True, f"XNNPACK delegate (an operand of {config}'s quantized pattern)"
    kernel = kernel_for(op)
    if kernel is not None:
        refused = xnnpack_configs().get(_edge_form(op).__name__)
        why = (f"; XNNPACK's {type(refused).__name__} refuses its input types or symbolic "
               "sizes" if refused is not None else "")
        why = f"; {refusal(node)}" if refusal(node) else why
        if refused is not None and (refused_by := constraint_refusal(refused, node)):
            why = f"; {refused_by}"
        return True, f"portable kernel {kernel}{why}"
    custom = " (custom op)" if is_custom_op(op) else ""
    return False, (f"{op.name()}{custom}: no XNNPACK config and no ExecuTorch kernel "
                   "registered in this runtime")
