"""A failed executorch build is bisected inside its one partition (targets/executorch/
inside.py): ExecuTorch's ETDump debug buffer, with one XNNPACK delegate per op, names the
first op whose output parts from eager and whether XNNPACK or a portable kernel ran it.

The wrong values are real: ExecuTorch's own bugs, with the workaround that hides each one
switched off (tests/models/executorch_bisect.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch")

import runtime  # noqa: E402
from targets.executorch import floor_remainder, inside, xnnpack_guards  # noqa: E402
from tests.models.executorch_bisect import tanh_gelu_block  # noqa: E402

MODELS = "tests/models/executorch_bisect.py"


@pytest.fixture
def no_gelu_guard(monkeypatch):
    """XNNPACK takes gelu(approximate='tanh') again, and computes the exact erf GELU."""
    monkeypatch.setattr(xnnpack_guards, "_GUARDS", {})
    xnnpack_guards.partitioner_configs.cache_clear()
    yield
    xnnpack_guards.partitioner_configs.cache_clear()  # later builds get the guard back


def _failed_bisect(model: str, tmp_path) -> tuple[dict, str]:
    import exporter.builder.pipeline as pipeline
    from exporter.errors import ValidationFailedError
    from exporter.settings import BuildSettings

    out = tmp_path / "wrong.artifact"
    with pytest.raises(ValidationFailedError) as failed:
        pipeline.build(f"{MODELS}:{model}", BuildSettings(target="executorch", out=out,
                                                          keep_failed=True))
    kept = out.with_name("wrong.FAILED-VALIDATION.artifact")
    return runtime.read_manifest(kept).validation["bisect"], "\n".join(failed.value.details)


def test_tanh_gelu_computed_as_exact_gelu_is_found_inside_the_xnnpack_delegate(
        no_gelu_guard, tmp_path):
    found, text = _failed_bisect("tanh_gelu_block", tmp_path)
    assert found["first_divergent"] == "p0"
    got = found["inside"]
    # the linear before it matches eager; the gelu is the first value off
    assert (got["value"], got["op"], got["backend_op"]) == (
        "gelu", "aten.gelu.default", "XNNPACK delegate (gelu), in the built program's "
        "XNNPACK subgraph 0 of 1 (linear, gelu, linear_1)")
    assert got["diverges"] and got["compared"] == 3
    assert "executorch_bisect.py:17" in got["source"]
    assert "the first to diverge is 'gelu'" in text
    assert "logs a delegate's outputs only" in text


@pytest.mark.slow  # a second failing build and traced run; the gelu one above runs in make test
def test_integer_remainder_on_the_portable_kernel_is_named_as_that_kernel(
        monkeypatch, tmp_path):
    monkeypatch.setattr(floor_remainder, "_REMAINDERS", ())  # C's sign rule reaches the kernel
    found, text = _failed_bisect("slot_index", tmp_path)
    got = found["inside"]
    assert (got["value"], got["op"], got["backend_op"]) == (
        "remainder", "aten.remainder.Scalar", "portable kernel aten::remainder.Scalar_out")
    assert got["mismatches"] > 0 and "executorch_bisect.py:34" in got["source"]
    assert "portable kernel aten::remainder.Scalar_out from aten.remainder.Scalar" in text


def test_every_op_of_a_correct_program_matches_eager_in_run_order():
    """With the guard on, every op's logged value equals eager's, named after the program's
    nodes in the order ExecuTorch ran them; the gelu runs on the portable kernel."""
    from plan.partition import node_values

    model, (x,) = tanh_gelu_block()
    program = torch.export.export(model, (x,))
    reference = {node.name: value for node, value in node_values(program, [x]).items()
                 if node.op == "call_function"}
    produced = inside.intermediate_values(program, {k: v.dtype for k, v in reference.items()},
                                          [x])
    assert [(where, name) for where, name, _ in produced] == [
        ("XNNPACK delegate (linear)", "linear"),
        ("portable kernel aten::gelu.out", "gelu"),
        ("XNNPACK delegate (linear_1)", "linear_1")]
    for _, name, value in produced:
        torch.testing.assert_close(value, reference[name], rtol=1e-5, atol=1e-5)


def test_inspect_lists_the_nodes_inside_each_xnnpack_subgraph_in_run_order():
    """The meta's ``subgraphs`` (lower.py) reach `exporter inspect` and the report; a long
    list is cut with a count, as the kernels' list is."""
    from types import SimpleNamespace

    from targets.executorch.describe import placement_lines

    subgraphs = [["linear", "gelu", "linear_1"], *[[f"mul_{i}"] for i in range(8)]]
    partition = SimpleNamespace(name="p0", meta={
        "placement": {"aten.linear.default": {"XNNPACK": 2}}, "xnnpack_ops": 11,
        "delegates": 9, "portable_ops": 0, "subgraphs": subgraphs})
    lines = placement_lines(partition)
    assert lines[1].startswith("XNNPACK subgraphs of p0 in run order: 0: linear, gelu, "
                               "linear_1; 1: mul_0;")
    assert lines[1].endswith("; 3 more subgraph(s)")


def test_a_node_executorch_decomposes_is_compared_once_by_its_last_part():
    """ExecuTorch lowers a 4-D matmul as expand, view, bmm, view, each named after the
    matmul; the expand has the matmul's shape but not its values, and must not be blamed."""
    from plan.partition import node_values

    class Scores(torch.nn.Module):
        def forward(self, q, k):
            return torch.relu(q @ k)

    q, k = torch.randn(2, 4, 16, 16), torch.randn(2, 4, 16, 16)
    program = torch.export.export(Scores(), (q, k))
    reference = {node.name: value for node, value in node_values(program, [q, k]).items()
                 if node.op == "call_function"}
    produced = inside.intermediate_values(program, {k: v.dtype for k, v in reference.items()},
                                          [q, k])
    assert [name for _, name, _ in produced] == ["matmul", "relu"]
    for _, name, value in produced:
        torch.testing.assert_close(value, reference[name], rtol=1e-5, atol=1e-5)


def test_a_traced_run_that_aborts_fails_the_look_inside_not_the_build_process(tmp_path):
    """ExecuTorch aborts its process when the debug buffer runs out: the traced run is a
    child's, and its death is an error bisect reports (it then stops at the partition)."""
    from targets.executorch.lower import lower_program
    from targets.executorch.traced_run import TracedRunError, traced_run

    layer, x = torch.nn.Linear(16, 16).eval(), torch.randn(4, 16)
    buffer = lower_program(torch.export.export(layer, (x,))).buffer
    with pytest.raises(TracedRunError, match="traced run exited with"):
        traced_run(buffer, [x], 64, tmp_path)  # room for no tensor at all
    dump, debug = traced_run(buffer, [x], 1 << 20, tmp_path)
    assert dump and debug
