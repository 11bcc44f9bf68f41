"""The cuda target's timed choice between cuBLAS and our row kernel for one-row linears
(targets/aoti/passes/row_linear_choice.py): the cuBLAS form against eager and the rewrite
of the chosen lone linears on the CPU; the timing itself on a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from targets.aoti.passes.row_linear_choice import (
    RowLinearsOnCublasByTiming,
    linear_on_cublas,
    rewritten,
)

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("with_bias", [True, False])
def test_the_cublas_form_computes_the_linear(with_bias):
    torch.manual_seed(0)
    x = torch.randn(1, 1, 24, dtype=torch.float64)
    weight = torch.randn(10, 24, dtype=torch.float64)
    bias = torch.randn(10, dtype=torch.float64) if with_bias else None
    got = linear_on_cublas(x, weight, bias)
    assert got.shape == (1, 1, 10)
    torch.testing.assert_close(got, F.linear(x, weight, bias))


class _Classifier(torch.nn.Module):
    """Two lone linears (fc1, fc2) and one whose output a residual add reads (fc3)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 16)
        self.fc2 = torch.nn.Linear(16, 16, bias=False)
        self.fc3 = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = self.fc2(torch.relu(self.fc1(x.flatten(1))))
        return h + self.fc3(h)


def _calls(program, target) -> int:
    return sum(n.target is target for n in program.graph.nodes)


def test_only_chosen_lone_linears_move_to_cublas_with_eager_values():
    torch.manual_seed(0)
    model = _Classifier().eval()
    x = torch.randn(1, 2, 16)
    program = torch.export.export(model, (x,))
    seen = []

    def choose(key, sample):
        seen.append(key)
        return key[1]  # the ones with a bias: fc1 (fc3 is never offered)
    result = rewritten(program, choose)
    assert [key[0] for key in seen] == [(16, 32), (16, 16)]
    assert result.modified and result.info["row_linears_on_cublas"] == 1
    assert _calls(result.program, torch.ops.aten.addmm.default) == 1
    assert _calls(result.program, torch.ops.aten.linear.default) == 2
    with torch.no_grad():
        torch.testing.assert_close(result.program.module()(x), model(x))


def test_without_a_gpu_nothing_is_timed_or_changed():
    model = _Classifier().eval()
    program = torch.export.export(model, (torch.randn(1, 2, 16),))
    timed = []
    result = RowLinearsOnCublasByTiming(timer=lambda call: timed.append(call) or 1.0)(program)
    assert not result.modified and not timed and result.info["row_linears"] == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_classifier_keeps_eager_values_whichever_kernel_wins():
    torch.manual_seed(0)
    model = _Classifier().half().cuda().eval()
    x = torch.randn(1, 2, 16, device="cuda", dtype=torch.half)
    program = torch.export.export(model, (x,))
    result = RowLinearsOnCublasByTiming()(program)
    assert len(result.info["row_linears"]) == 2
    assert all(set(t) == {"row_kernel", "cublas"} and min(t.values()) > 0
               for t in result.info["row_linears"].values())
    with torch.no_grad():
        torch.testing.assert_close(result.program.module()(x).float(), model(x).float(),
                                   rtol=2e-3, atol=2e-3)


def test_plain_builds_time_lone_row_linears_before_the_row_kernels_take_them(tmp_path,
                                                                              monkeypatch):
    from targets import get_target
    from targets.aoti import cuda as cuda_module
    from targets.base import LowerOptions
    monkeypatch.setattr(cuda_module.decode_ops, "TRITON", True)  # as on a GPU machine
    cuda = get_target("cuda")

    def names(**options) -> list[str]:
        return [p.name for p in cuda.default_passes(LowerOptions(tmp_path, **options))]
    assert names().index("row_linears_on_cublas_by_timing") < names().index(
        "row_linears_as_kernels")
    assert "row_linears_on_cublas_by_timing" not in names(shared_weights=True)
    assert "row_linears_on_cublas_by_timing" not in names(deterministic=True)
    # measured and not (yet) faster: off by default, bench/cuda_gap.py's add_passes
    assert {"depthwise_convs_by_timing", "narrow_convs_padded_by_timing"} <= set(
        cuda_module.CANDIDATE_PASSES) and not {"depthwise_convs_by_timing",
                                               "narrow_convs_padded_by_timing"} & set(names())
