"""Split an ExportedProgram into delegated and CPU-fallback partitions.

Which nodes a target runs comes from its support table; the grouping comes from
torch's ``CapabilityBasedPartitioner`` (no partitioning algorithm of our own).
Delegated groups smaller than ``min_partition_size`` compute nodes go back to
the CPU. The nodes left over are grouped by a second partitioner run, so every
call node lands in exactly one partition. Each partition is convex, so the
partitions form a DAG and are emitted in topological order.

Every partition becomes its own ExportedProgram with flat tensor inputs and a
tuple of tensor outputs; weights it reads are moved into it as attributes (so a
backend can fold them) rather than passed in at run time.
"""

from __future__ import annotations

import heapq
import logging
import operator
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx import Graph, GraphModule, Node
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from passes.graph.dims import export_keeping_dims
from passes.graph.rewrite import keep_source_meta
from runtime.errors import ToolchainError

log = logging.getLogger(__name__)


class PartitionError(ToolchainError):
    """The program cannot be split as planned (exit code 3). ``plan``: the partition
    that could not be re-captured on its own, when it was one."""

    def __init__(self, *args, plan: "PlannedPartition | None" = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.plan = plan


@dataclass
class PlannedPartition:
    name: str
    delegated: bool  # True: the target's backend; False: CPU fallback (torch)
    nodes: list[Node]
    inputs: list[str] = field(default_factory=list)  # value names, in call order
    outputs: list[str] = field(default_factory=list)
    program: ExportedProgram | None = None


class _Supports(OperatorSupportBase):
    def __init__(self, predicate: Callable[[Node], bool]) -> None:
        self.predicate = predicate

    def is_node_supported(self, submodules, node: Node) -> bool:
        return node.op == "call_function" and self.predicate(node)


def _groups(gm: GraphModule, predicate: Callable[[Node], bool]) -> list[set[Node]]:
    partitioner = CapabilityBasedPartitioner(gm, _Supports(predicate),
                                             allows_single_node_partition=True)
    return [set(p.nodes) for p in partitioner.propose_partitions()]


def is_shape_node(node: Node) -> bool:
    """Nodes computing sizes (``sym_size``, SymInt arithmetic). They never cross a
    partition boundary: a size passed as a plain int would be specialised on
    re-capture, so each partition recomputes the sizes it needs from its own inputs."""
    return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool, int,
                                             float, bool))


def _compute_nodes(nodes: set[Node]) -> int:
    return sum(1 for n in nodes if n.target is not operator.getitem)


def plan_partitions(program: ExportedProgram, supported: Callable[[Node], bool],
                    min_partition_size: int = 1) -> list[PlannedPartition]:
    """Group call nodes into partitions, in an order the runtime can execute."""
    gm = program.graph_module
    delegated = [g for g in _groups(gm, lambda n: not is_shape_node(n) and supported(n))
                 if _compute_nodes(g) >= min_partition_size]
    taken = set().union(*delegated) if delegated else set()
    fallback = _groups(gm, lambda n: not is_shape_node(n) and n not in taken)
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    groups, ranked = _ordered(delegated, fallback, order)
    if ranked is None:  # a cycle between the two runs' groups: cut the fallback's
        groups, ranked = _ordered(delegated, _split_by_epoch(delegated, fallback, order),
                                  order)
    if ranked is None:  # the split leaves none (its docstring): ours to fix, not the user's
        raise RuntimeError("the partition plan has a cycle between its groups")
    plans = []
    for rank, index in enumerate(ranked):
        is_delegated, nodes = groups[index]
        plans.append(PlannedPartition(f"p{rank}", is_delegated,
                                      sorted(nodes, key=order.__getitem__)))
    return plans


def _ordered(delegated: list[set[Node]], fallback: list[set[Node]], order: dict
             ) -> tuple[list, list[int] | None]:
    groups = [(True, g) for g in delegated] + [(False, g) for g in fallback]
    owner = {node: index for index, (_, g) in enumerate(groups) for node in g}
    return groups, _topological(groups, owner, order)


def _split_by_epoch(delegated: list[set[Node]], fallback: list[set[Node]], order: dict
                    ) -> list[set[Node]]:
    """Fallback groups cut where a delegated group lies between their nodes.

    The two partitioner runs each avoid cycles among their own groups, not between them:
    a fallback group may hold one node that feeds a delegated group and another that
    reads it (two of the delegated group's independent nodes), a cycle no run order
    satisfies. A node's epoch is the most delegated groups on a path into it (over the
    delegated groups and single fallback nodes, acyclic by the first run); every edge
    between groups keeps or raises it and leaving a delegated group raises it, so cutting
    each fallback group by epoch leaves no cycle."""
    if not delegated or not fallback:
        return fallback
    units = [(True, g) for g in delegated] + [(False, {n}) for g in fallback for n in g]
    owner = {node: index for index, (_, g) in enumerate(units) for node in g}
    ranked = _topological(units, owner, order)
    if ranked is None:  # not a DAG of the first run's making: nothing to cut by
        return fallback
    epoch: dict[int, int] = {}
    for index in ranked:
        epoch[index] = max((epoch[owner[arg]] + units[owner[arg]][0]
                            for node in units[index][1] for arg in _tensor_inputs(node)
                            if arg in owner and owner[arg] != index), default=0)
    pieces = []
    for group in fallback:
        by_epoch: dict[int, set[Node]] = {}
        for node in group:
            by_epoch.setdefault(epoch[owner[node]], set()).add(node)
        pieces.extend(by_epoch[e] for e in sorted(by_epoch))
    return pieces


def _topological(groups, owner: dict, order: dict) -> list[int] | None:
    """Kahn's order over the partition DAG, ties broken by first node position; None
    where the groups form a cycle."""
    users: dict[int, set[int]] = {i: set() for i in range(len(groups))}
    waiting = [0] * len(groups)
    for index, (_, nodes) in enumerate(groups):
        deps = {owner[arg] for node in nodes for arg in _tensor_inputs(node)
                if arg in owner and owner[arg] != index}
        waiting[index] = len(deps)
        for dep in deps:
            users[dep].add(index)
    first = [min(order[n] for n in g) for _, g in groups]
    ready = [(first[i], i) for i in range(len(groups)) if not waiting[i]]
    heapq.heapify(ready)
    ranked = []
    while ready:
        _, index = heapq.heappop(ready)
        ranked.append(index)
        for user in users[index]:
            waiting[user] -= 1
            if not waiting[user]:
                heapq.heappush(ready, (first[user], user))
    return ranked if len(ranked) == len(groups) else None


def _tensor_inputs(node: Node) -> list[Node]:
    """A node's tensor inputs, looking through shape nodes to the tensors they measure."""
    found, stack = [], list(node.all_input_nodes)
    while stack:
        arg = stack.pop()
        if is_shape_node(arg):
            stack.extend(arg.all_input_nodes)
        elif arg not in found:
            found.append(arg)
    return found


def materialize(program: ExportedProgram, plans: list[PlannedPartition],
                input_names: list[str], output_names: list[str],
                example_inputs: list[torch.Tensor]) -> None:
    """Fill each plan's inputs/outputs/program (re-captured with torch.export)."""
    names = value_names(program, input_names, output_names)
    values = node_values(program, example_inputs)
    # A value computed from weights alone (a transposed embedding for a tied head) is a
    # constant to every partition that reads it, not a run-time input: torch.export
    # would otherwise guard it as an input, and TVM's import failed on that guard.
    constants = {**_constant_values(program), **_weight_only_values(program, values)}
    for plan in plans:
        members = set(plan.nodes)
        outside_inputs = []
        for node in plan.nodes:
            for arg in _tensor_inputs(node):
                if arg not in members and arg not in constants and arg not in outside_inputs \
                        and arg.op != "get_attr":  # a subgraph (HOP body): copied in
                    outside_inputs.append(arg)
        outputs = [n for n in plan.nodes if any(u not in members for u in n.users)]
        plan.inputs = [names[n] for n in outside_inputs]
        plan.outputs = [names[n] for n in outputs]
        sub = _submodule(plan.nodes, outside_inputs, outputs, constants, program.graph_module)
        args = tuple(values[n] for n in outside_inputs)
        try:
            plan.program = export_keeping_dims(sub, args, outside_inputs, program)
        except Exception as exc:  # noqa: BLE001 - torch.export raises many types
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            raise PartitionError(
                f"partition '{plan.name}' ({len(plan.nodes)} ops from "
                f"{plan.nodes[0].name} to {plan.nodes[-1].name}) could not be captured on "
                f"its own ({type(exc).__name__}: {first})", plan=plan,
                hint="--verbose shows torch.export's traceback") from exc
        keep_source_meta(plan.program, sub)


def value_names(program: ExportedProgram, input_names: list[str], output_names: list[str]
                 ) -> dict[Node, str]:
    names = {n: n.name for n in program.graph.nodes}
    user_inputs = [n for n in program.graph.nodes
                   if n.op == "placeholder" and n.name in program.graph_signature.user_inputs]
    names.update(zip(user_inputs, input_names))
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    results = list(output_node.args[0])[-len(output_names):] if output_names else []
    seen = set()
    for node, name in zip(results, output_names):
        if not isinstance(node, Node) or node.op == "placeholder" or node in seen:
            raise PartitionError(
                f"output '{name}' is an input or repeats another output; a build with more "
                "than one partition needs every output to be a distinct computed tensor",
                hint="return a copy (x.clone()) or build with --fallback allow on a target "
                     "that runs the whole model")
        seen.add(node)
        names[node] = name
    return names


def _constant_values(program: ExportedProgram) -> dict[Node, torch.Tensor]:
    """Placeholders that carry weights, buffers or constants -> their tensors."""
    by_name = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    values = {}
    for spec in program.graph_signature.input_specs:
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            source = program.state_dict.get(spec.target)
            if source is None:
                source = program.constants[spec.target]
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            source = program.constants[spec.target]
        else:
            continue
        values[by_name[spec.arg.name]] = source
    return values


def _weight_only_values(program: ExportedProgram, values: dict) -> dict[Node, torch.Tensor]:
    """Call nodes whose inputs are all weights or such nodes -> their (fixed) values."""
    known = set(_constant_values(program))
    found: dict[Node, torch.Tensor] = {}
    for node in program.graph.nodes:
        if node.op != "call_function" or not node.all_input_nodes:
            continue
        if all(arg in known for arg in node.all_input_nodes) and \
                isinstance(values.get(node), torch.Tensor) and not _is_random(node):
            known.add(node)
            found[node] = values[node]
    return found


def _is_random(node: Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return bool(schema is not None and schema.is_mutable) or \
        getattr(node.target, "__name__", "").startswith(("rand", "normal", "bernoulli", "dropout"))


def node_values(program: ExportedProgram, example_inputs: list[torch.Tensor]) -> dict:
    """Every node's value on the example inputs (real tensors, for re-capture)."""
    constants = _constant_values(program)
    user = iter(example_inputs)
    args = [constants[n] if n in constants else next(user)
            for n in program.graph.nodes if n.op == "placeholder"]
    values: dict = {}
    written = _written_later(program)

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node):
            result = super().run_node(node)
            # a copy where a later in-place op (unsqueeze_, scatter_) changes the tensor:
            # the value re-capture sees is the one this node made
            values[node] = result.clone() if node in written and \
                isinstance(result, torch.Tensor) else result
            return result

    with torch.no_grad():
        Recorder(program.graph_module).run(*args)
    return values


def _written_later(program: ExportedProgram) -> set[Node]:
    """Nodes whose tensor an op changes in place (its schema writes that argument)."""
    found = set()
    for node in program.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None:
            continue
        for index, argument in enumerate(schema.arguments):
            if argument.alias_info is not None and argument.alias_info.is_write:
                value = (node.args[index] if index < len(node.args)
                         else node.kwargs.get(argument.name))
                if isinstance(value, Node):
                    found.add(value)
    return found


def _submodule(nodes: list[Node], inputs: list[Node], outputs: list[Node],
               constants: dict[Node, torch.Tensor], source: GraphModule) -> GraphModule:
    root = torch.nn.Module()
    graph = Graph()
    env: dict[Node, Node] = {}
    for node in inputs:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)

    def resolve(arg: Node) -> Node:
        if arg not in env:
            if arg in constants:
                attr = f"w_{arg.name}"
                root.register_buffer(attr, constants[arg])
                env[arg] = graph.get_attr(attr)
            elif arg.op == "get_attr":  # the body of a higher-order op (set_grad, autocast)
                root.add_module(arg.target.replace(".", "_"), source.get_submodule(arg.target))
                env[arg] = graph.get_attr(arg.target.replace(".", "_"))
            else:  # a shape node: recompute it here from tensors this partition has
                env[arg] = graph.node_copy(arg, resolve)
        return env[arg]

    for node in nodes:
        env[node] = graph.node_copy(node, resolve)
    graph.output(tuple(env[n] for n in outputs))
    return GraphModule(root, graph)
