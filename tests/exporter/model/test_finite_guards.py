"""A data-dependent ``if`` that guards fp16 overflow (transformers' BART, T5, LongT5) is
captured as its repair branch, unconditionally (exporter/model/finite_guards.py)."""

from __future__ import annotations

import pytest
import torch

import exporter
from exporter.model.cast import cast_model
from exporter.model.finite_guards import repair_finiteness_guards
from tests.models import finite_guard

aten = torch.ops.aten


def _targets(program) -> list:
    return [node.target for node in program.graph.nodes if node.op == "call_function"]


def test_every_spelling_of_an_overflow_guard_captures_as_its_repair():
    model, args, shapes = finite_guard.factory()
    with repair_finiteness_guards() as taken:
        program = torch.export.export(model, args, dynamic_shapes=shapes, strict=False)
    targets = _targets(program)
    assert targets.count(aten.clamp.default) == 3 and aten.nan_to_num.default in targets
    assert aten.item.default not in targets and aten._local_scalar_dense.default not in targets
    assert len(set(taken)) == 4  # one line per guard
    x = torch.randn(4, 8)
    torch.testing.assert_close(program.module()(x), model(x))  # a no-op on finite values
    x[0, 0] = float("inf")
    torch.testing.assert_close(program.module()(x), model(x))  # the repair, as eager


def test_a_guard_on_other_data_still_fails_capture():
    class Branchy(torch.nn.Module):
        def forward(self, x):
            if (x.sum() > 0) or torch.isinf(x).all():  # not "is any value non-finite"
                return x + 1
            return x - 1

    with repair_finiteness_guards(), pytest.raises(Exception, match="data-dependent"):
        torch.export.export(Branchy(), (torch.randn(3),), strict=False)
    assert torch.Tensor.__bool__ is not None and bool(torch.tensor(True))  # restored


def test_fp16_bart_captures_with_the_clamp_in_its_graph():
    pytest.importorskip("transformers")
    model, args, _ = finite_guard.bart_factory()
    with pytest.raises(Exception, match="data-dependent"):
        torch.export.export(cast_model(model, "fp16"), args, strict=False)
    with repair_finiteness_guards():
        program = torch.export.export(cast_model(model, "fp16"), args, strict=False)
    assert aten.clamp.default in _targets(program)


@pytest.mark.slow
def test_fp16_bart_builds_and_validates_on_onnx(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("transformers")
    built = exporter.build("tests/models/finite_guard.py:bart_factory", target="onnx",
                           dtype="fp16", out=tmp_path / "bart16.artifact")
    assert built.manifest.validation["passed"]
