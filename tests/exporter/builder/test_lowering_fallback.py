"""A backend that claims an op and then fails on it, naming nothing (torch.onnx finding no
overload for one aten.sub, TVM refusing one Concat), sends that op alone to the CPU
fallback, not its whole partition (exporter/builder/isolate.py); a build whose ops mostly
run on the fallback says so in one line."""

from __future__ import annotations

import pytest
import torch

import exporter
from exporter.builder.placement import mostly_fallback, place
from targets.base import Support
from targets.registry import get_target
from tests.models import unconvertible

pytest.importorskip("onnxruntime")


@pytest.fixture
def onnx_claims_edgetest_ops(monkeypatch):
    """The onnx target claims the edgetest custom ops, which torch.onnx cannot translate:
    lowering fails on them as on an overload torch.onnx lacks."""
    from targets.onnx.target import OnnxTarget
    supports = OnnxTarget.supports

    def claiming(self, node):
        if getattr(node.target, "namespace", None) == "edgetest":
            return Support(True, "test: claimed, not translatable")
        return supports(self, node)
    monkeypatch.setattr(OnnxTarget, "supports", claiming)


def _placed(manifest) -> dict[str, str]:
    return {row["node"]: row["backend"] for row in manifest.coverage}


def test_the_op_a_backend_fails_on_moves_alone_to_the_fallback(onnx_claims_edgetest_ops,
                                                                tmp_path):
    built = exporter.build("tests/models/unconvertible.py:factory", target="onnx",
                           out=tmp_path / "middle.artifact")
    placed = _placed(built.manifest)
    assert [node for node, backend in placed.items() if backend == "torch"] == ["mid_clip"]
    assert sum(backend == "onnxruntime" for backend in placed.values()) >= 5
    assert built.manifest.validation["passed"]
    assert any("1 op(s) moved to the CPU fallback" in w for w in built.warnings)
    assert not any("ops run on the CPU fallback, not onnx" in w for w in built.warnings)


def test_two_regions_failing_in_turn_replan_into_partitions_that_run(onnx_claims_edgetest_ops,
                                                                      tmp_path):
    """mid_clip fails first, then mix: the plan after both holds a fallback region that
    feeds the target's region and reads from it (once an internal error in planning)."""
    built = exporter.build("tests/models/unconvertible.py:interleaved_factory",
                           target="onnx", out=tmp_path / "interleaved.artifact")
    placed = _placed(built.manifest)
    assert {node for node, backend in placed.items() if backend == "torch"} == {"mid_clip",
                                                                                "mix"}
    assert built.manifest.validation["passed"]


def test_most_ops_on_the_fallback_is_one_warning_line_with_the_reasons():
    model, args, _ = unconvertible.mostly_custom_factory()
    program = torch.export.export(model, args, strict=False)
    target = get_target("onnx")
    line = mostly_fallback(place(program, target, 1), target)
    assert line.startswith("4 of 5 ops run on the CPU fallback, not onnx: ")
    assert "edgetest::mid_clip (custom op) (3 ops); " in line and "\n" not in line
    model, args, _ = unconvertible.factory()
    program = torch.export.export(model, args, strict=False)
    assert mostly_fallback(place(program, target, 1), target) is None  # 1 of 6


def test_a_fallback_warning_names_six_ops_and_counts_the_rest():
    from exporter.builder.lowering import named
    assert named(["a", "b"]) == "a, b"
    ops = [f"add_{i}" for i in range(69)]
    assert named(ops) == ("add_0, add_1, add_2, add_3, add_4, add_5 and 63 more "
                          "(`exporter inspect ARTIFACT` lists them)")
