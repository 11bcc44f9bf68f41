"""In-place shape changes (``x.unsqueeze_(2)``, BigBird's attention) become views that
what reads ``x`` afterwards reads, so partitions and backends see the new shape
(passes/cleanup/shape_mutations.py)."""

from __future__ import annotations

import torch

from passes.cleanup.shape_mutations import ShapeMutationsAsViews
from plan.partition import plan_partitions

aten = torch.ops.aten


class ShapeInPlace(torch.nn.Module):
    def forward(self, x):
        a = x * 2
        before = a.sum(-1)  # reads the old shape
        a.unsqueeze_(1)
        a.transpose_(0, 1)
        return torch.cat([a, a + 1], 0), before


def _calls(program) -> list:
    return [n.target for n in program.graph.nodes if n.op == "call_function"]


def test_in_place_shape_changes_become_views_read_after_them():
    model, x = ShapeInPlace(), torch.randn(3, 4)
    program = torch.export.export(model, (x,), strict=False)
    assert aten.unsqueeze_.default in _calls(program)
    result = ShapeMutationsAsViews()(program)
    assert result.modified and result.info["rewritten"] == 2
    calls = _calls(result.program)
    assert aten.unsqueeze_.default not in calls and aten.transpose_.default not in calls
    for got, want in zip(result.program.module()(x), model(x)):
        torch.testing.assert_close(got, want)


def test_a_partition_boundary_after_the_shape_change_keeps_the_new_shape():
    """The cat on one side, the shape change on the other: the cat reads the view."""
    model, x = ShapeInPlace(), torch.randn(3, 4)
    program = ShapeMutationsAsViews()(torch.export.export(model, (x,), strict=False)).program
    plans = plan_partitions(program, lambda n: n.target is not aten.unsqueeze.default)
    (cat,) = [n for n in program.graph.nodes if n.target is aten.cat.default]
    assert {a.target for a in cat.args[0]} >= {aten.transpose.int}
    assert len(plans) == 3  # target, fallback (the view), target


def test_a_program_without_them_is_left_alone():
    program = torch.export.export(torch.nn.Linear(4, 4), (torch.randn(2, 4),), strict=False)
    assert not ShapeMutationsAsViews()(program).modified
