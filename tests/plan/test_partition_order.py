"""Partitions always form a DAG the runtime can run in order (plan/partition.py): the
delegated and the fallback partitioner runs each avoid cycles among their own groups, and
a fallback group that feeds a delegated group and reads from it is cut in two."""

from __future__ import annotations

import random

import torch
from torch.fx import Graph, GraphModule

from passes.graph.ops import is_custom_op
from plan.partition import _tensor_inputs, plan_partitions
from tests.models import unconvertible


class _Program:  # what plan_partitions reads of an ExportedProgram
    def __init__(self, gm: GraphModule) -> None:
        self.graph_module = gm


def _assert_runs_in_order(plans, gm: GraphModule) -> None:
    where = {node: i for i, plan in enumerate(plans) for node in plan.nodes}
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert len(where) == sum(len(p.nodes) for p in plans) and set(calls) <= set(where)
    for node in calls:  # every value is made by an earlier partition or its own
        assert all(where[arg] <= where[node] for arg in _tensor_inputs(node) if arg in where)


def test_a_fallback_region_that_feeds_and_reads_a_target_region_is_split():
    model, args, _ = unconvertible.interleaved_factory()
    program = torch.export.export(model, args, strict=False)
    plans = plan_partitions(program, lambda n: not is_custom_op(n.target))
    _assert_runs_in_order(plans, program.graph_module)
    fallback = [sorted(n.name for n in p.nodes) for p in plans if not p.delegated]
    assert len(fallback) == 2  # mid_clip before the target's region, mix after it


def _random_graph(rng: random.Random) -> tuple[GraphModule, dict[str, bool]]:
    graph = Graph()
    values = [graph.placeholder("x")]
    for _ in range(rng.randint(3, 30)):
        args = rng.sample(values, min(rng.choice([1, 2]), len(values)))
        op = torch.ops.aten.relu.default if len(args) == 1 else torch.ops.aten.add.Tensor
        node = graph.call_function(op, tuple(args))
        node.meta["val"] = torch.empty(2)
        values.append(node)
    graph.output(tuple(v for v in values[1:] if not v.users))
    return GraphModule(torch.nn.Module(), graph), {n.name: rng.random() < 0.5
                                                   for n in graph.nodes}


def test_random_placements_always_give_partitions_that_run_in_order():
    """Any mix of supported and unsupported ops (a third of these graphs once planned
    a cycle: `min() arg is an empty sequence`)."""
    for seed in range(400):
        rng = random.Random(seed)
        gm, supported = _random_graph(rng)
        plans = plan_partitions(_Program(gm), lambda n: supported[n.name],
                                min_partition_size=rng.choice([1, 2, 3]))
        _assert_runs_in_order(plans, gm)
        assert all(supported[n.name] for p in plans if p.delegated for n in p.nodes)


def test_a_value_changed_in_place_later_is_recorded_as_it_was_made():
    """Re-capturing a partition takes each input's example value: one that a later
    in-place op changes (BigBird's unsqueeze_, scatter_) is the value as made."""
    from plan.partition import node_values

    class Grows(torch.nn.Module):
        def forward(self, x):
            a = x + 1
            b = a * 2
            a.unsqueeze_(0)
            a.add_(5)
            return b, a

    x = torch.zeros(3)
    program = torch.export.export(Grows(), (x,), strict=False)
    values = node_values(program, [x])
    (made,) = [n for n in program.graph.nodes if n.target is torch.ops.aten.add.Tensor]
    assert values[made].shape == (3,) and torch.equal(values[made], torch.ones(3))
