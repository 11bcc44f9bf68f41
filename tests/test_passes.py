"""Passes: before/after graphs, numerics against the unpassed program, honest `modified`."""

from __future__ import annotations

import torch

from exporter.zoo import ZOO
from passes.base import run_pipeline
from passes.cast_dtype import CastFloatDtype
from passes.dead_code import EliminateDeadCode


class _Dangling(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x)
        _unused = torch.tanh(y)  # a dropped output leaves this behind
        return torch.relu(y)


def _ops(program) -> list[str]:
    return [str(n.target) for n in program.graph.nodes if n.op == "call_function"]


def test_dead_code_removes_the_unused_branch_and_is_idempotent():
    x = torch.randn(2, 4)
    program = torch.export.export(_Dangling().eval(), (x,))
    expected = program.module()(x)
    assert "aten.tanh.default" in _ops(program)
    first = EliminateDeadCode()(program)
    assert first.modified and first.info["nodes_removed"] == 1
    assert "aten.tanh.default" not in _ops(first.program)
    torch.testing.assert_close(first.program.module()(x), expected)
    second = EliminateDeadCode()(first.program)
    assert not second.modified and second.info["nodes_removed"] == 0


def test_cast_pass_runs_math_in_bf16_and_keeps_io_dtypes():
    module, args, dynamic_shapes = ZOO["encoder"]()
    program = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    result = CastFloatDtype("bf16")(program)
    assert result.modified
    assert result.info["float_weight_bytes_after"] * 2 == result.info["float_weight_bytes_before"]
    params = [p for p in result.program.state_dict.values() if p.is_floating_point()]
    assert params and all(p.dtype == torch.bfloat16 for p in params)
    got = result.program.module()(*args)
    expected = module(*args)
    for key, value in expected.items():
        assert got[key].dtype == torch.float32  # callers keep their dtypes
        torch.testing.assert_close(got[key], value, rtol=0.1, atol=0.1)
    # dynamic batch survives the re-capture, with its bounds
    (bounds,) = result.program.range_constraints.values()
    assert (bounds.lower, bounds.upper) == (1, 32)
    again = CastFloatDtype("bf16")(result.program)
    assert not again.modified, "a second cast has nothing left to do"


def test_cast_pass_leaves_the_users_model_in_float32():
    module, args, _ = ZOO["mlp"]()
    CastFloatDtype("fp16")(torch.export.export(module, args))
    assert all(p.dtype == torch.float32 for p in module.parameters())


def test_pipeline_records_each_pass():
    x = torch.randn(2, 4)
    program = torch.export.export(_Dangling().eval(), (x,))
    _, records = run_pipeline(program, [EliminateDeadCode()])
    assert records[0]["name"] == "eliminate_dead_code" and records[0]["modified"] is True
