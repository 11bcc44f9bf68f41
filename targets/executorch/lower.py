"""One partition through ExecuTorch: ``to_edge_transform_and_lower`` with the XNNPACK
partitioner (XNNPACK takes what its configs claim; the rest stays on ExecuTorch's own
kernels), then ``to_executorch`` (memory planning, emission) to a ``.pte`` program.

What the meta records comes from ExecuTorch's own results: which ops went into XNNPACK
delegates and which run as kernels (the edge graph after partitioning), the kernels the
program calls and the arena sizes its memory planning chose (the emitted execution plan).
"""

from __future__ import annotations

import importlib.metadata
import logging
import operator
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.export import ExportedProgram

from targets.executorch.constant_layout import default_strides
from targets.executorch.legalize import delegation_without_copies
from targets.executorch.xnnpack_guards import partitioner_configs

log = logging.getLogger(__name__)

PROGRAM_NAME = "model.pte"
METHOD = "forward"


@dataclass
class LoweredProgram:
    """The ``.pte`` bytes and what ExecuTorch said about them."""

    buffer: bytes
    placement: dict[str, dict[str, int]]  # edge op -> {"XNNPACK": n, "portable": n}
    delegates: int  # XNNPACK subgraphs
    subgraphs: tuple[tuple[str, ...], ...]  # the program's nodes inside each, in run order
    kernels: tuple[str, ...]  # operators the program calls outside the delegates
    buffer_sizes: tuple[int, ...]  # memory planning's arenas (index 0 is reserved)
    bounds: dict[str, str] = field(default_factory=dict)  # dynamic dim -> its range

    @property
    def xnnpack_ops(self) -> int:
        return sum(row.get("XNNPACK", 0) for row in self.placement.values())

    @property
    def portable_ops(self) -> int:
        return sum(row.get("portable", 0) for row in self.placement.values())


def version() -> str:
    return importlib.metadata.version("executorch")


def lower_program(program: ExportedProgram) -> LoweredProgram:
    """The partition's program as an ExecuTorch program; ExecuTorch's own errors pass
    through (the target turns them into a LoweringError)."""
    bounds = dict(program.range_constraints)
    (placement, subgraphs), executorch_program = _lower(program, per_op=False)
    _check_planned_inputs(executorch_program.exported_program(), _input_bounds(program))
    plan = executorch_program.executorch_program.execution_plan[0]
    kernels = tuple(sorted({f"{o.name}.{o.overload}" if o.overload else o.name
                            for o in plan.operators}))
    return LoweredProgram(buffer=executorch_program.buffer, placement=placement,
                          delegates=len(subgraphs), subgraphs=subgraphs, kernels=kernels,
                          buffer_sizes=tuple(int(s) for s in plan.non_const_buffer_sizes),
                          bounds={str(s): f"{r.lower}..{r.upper}" for s, r in bounds.items()})


def lower_per_op(program: ExportedProgram):
    """For bisect: the program lowered as the build does, but with one XNNPACK delegate per
    op match (the partitioner's ``per_op_mode``), so ExecuTorch's ETDump, which logs a
    delegate's outputs and not the values inside it, logs each delegated op's output.
    Returns ExecuTorch's ``ExecutorchProgramManager``."""
    return _lower(program, per_op=True)[1]


def _lower(program: ExportedProgram, per_op: bool):
    import executorch.kernels.quantized  # noqa: F401 - out variants of q/dq XNNPACK leaves
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    bounds = dict(program.range_constraints)
    default_strides(program)
    partitioner = XnnpackPartitioner(configs=list(partitioner_configs()), per_op_mode=per_op)
    with delegation_without_copies():  # legalize.py: no program copy per delegate
        edge = to_edge_transform_and_lower(program, partitioner=[partitioner])
    _restore_bounds(edge.exported_program(), bounds)
    placement = _placement(edge.exported_program().graph_module)  # before to_executorch's passes
    return placement, edge.to_executorch()


class BoundsError(ValueError):
    """ExecuTorch planned an input smaller than its dynamic dims' upper bounds."""


def _restore_bounds(edge_program: ExportedProgram, bounds: dict) -> None:
    """Put the program's dim ranges back into the shape environment before memory
    planning: XNNPACK's lowering re-runs torch's fake conv, whose layout heuristic asks
    ``batch >= 16`` of a frozen environment; the guard is ignored, yet the range was
    left narrowed (1..32 became 2..15) and the arenas were planned for 15."""
    for env in {size.node.shape_env for node in edge_program.graph.nodes
                for size in getattr(node.meta.get("val"), "shape", ())
                if isinstance(size, torch.SymInt)}:
        for symbol, wanted in bounds.items():
            if symbol in env.var_to_range and env.var_to_range[symbol] != wanted:
                log.info("ExecuTorch narrowed %s to %s; planning for %s", symbol,
                         env.var_to_range[symbol], wanted)
                env.var_to_range[symbol] = wanted


def _input_bounds(program: ExportedProgram) -> dict[str, list[int]]:
    """Each user input's shape at the upper bound of its dims."""
    from executorch.exir.passes.sym_shape_eval_pass import eval_upper_bound
    users = set(program.graph_signature.user_inputs)
    return {n.name: [eval_upper_bound(s) for s in n.meta["val"].shape]
            for n in program.graph.nodes
            if n.op == "placeholder" and n.name in users and hasattr(n.meta.get("val"), "shape")}


def _check_planned_inputs(final: ExportedProgram, wanted: dict[str, list[int]]) -> None:
    """Every input's planned shape holds its largest allowed shape, else BoundsError."""
    for node in final.graph.nodes:
        spec = node.meta.get("spec")
        if node.op != "placeholder" or node.name not in wanted or not hasattr(spec, "shape"):
            continue
        if any(int(p) < w for p, w in zip(spec.shape, wanted[node.name])):
            raise BoundsError(f"ExecuTorch planned input '{node.name}' as {list(spec.shape)}, "
                              f"smaller than its bounds allow ({wanted[node.name]})")


def _placement(graph_module) -> tuple[dict[str, dict[str, int]], tuple[tuple[str, ...], ...]]:
    """Ops by where they run: inside each XNNPACK delegate's original graph, or as
    kernels in the top-level edge graph; and the program's nodes inside each delegate."""
    counts: dict[str, Counter] = {}
    subgraphs = []

    def add(node, where: str) -> bool:
        if node.op != "call_function" or node.target is operator.getitem:
            return False
        name = getattr(node.target, "__name__", str(node.target))
        if name == "executorch_call_delegate":
            return False
        counts.setdefault(name, Counter())[where] += 1
        return True

    for node in graph_module.graph.nodes:
        if node.op == "get_attr" and hasattr(getattr(graph_module, node.target, None),
                                             "original_module"):
            inner = getattr(graph_module, node.target).original_module.graph.nodes
            subgraphs.append(tuple(dict.fromkeys(source_name(n) for n in inner
                                                 if add(n, "XNNPACK"))))
        else:
            add(node, "portable")
    return ({op: dict(sorted(c.items())) for op, c in sorted(counts.items())},
            tuple(subgraphs))


def source_name(node) -> str:
    """The name of the node of the lowered program that ``node`` was made from: the root of
    its ``from_node`` provenance (ExecuTorch's passes rename and re-trace)."""
    name, sources = node.name, node.meta.get("from_node")
    while sources:
        name, sources = sources[0].name, sources[0].from_node
    return name
