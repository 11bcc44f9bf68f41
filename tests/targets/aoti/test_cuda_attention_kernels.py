"""The cuda target's timed choice of each attention call's kernel
(targets/aoti/passes/attention_kernels.py): the decomposition under a chosen kernel and
the choice rule checked on the CPU against eager; the timing itself on a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from targets.aoti.passes.attention_kernels import (
    AttentionKernelsByTiming,
    decomposed,
)
from targets.aoti.passes.attention_kernels import _key, _bound, _from_weights_only
from targets.aoti.passes.call_timing import MARGIN, faster

pytestmark = pytest.mark.cuda


class _TwoAttentions(torch.nn.Module):
    """A windowed attention with a mask made from a buffer, and a plain one over fewer
    queries with a mask read from an input."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("bias", torch.randn(1, 2, 9, 9))

    def forward(self, q, k, v, pad):
        windowed = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias * 2)
        plain = F.scaled_dot_product_attention(q[:, :, :5], k, v, attn_mask=pad)
        return windowed + 1, plain * 2


def _inputs():
    torch.manual_seed(0)
    return (*(torch.randn(1, 2, 9, 8) for _ in range(3)), torch.randn(1, 1, 5, 9))


def _attention_ops(program) -> list[str]:
    return [str(n.target) for n in program.graph.nodes
            if n.op == "call_function" and "attention" in str(n.target)]


def _sdpa_keys(program) -> list:
    return [_key(_bound(n.args, n.kwargs)) for n in program.graph.nodes
            if n.target is torch.ops.aten.scaled_dot_product_attention.default]


def test_each_call_decomposed_under_its_own_kernel_with_eager_values():
    model, inputs = _TwoAttentions().eval(), _inputs()
    program = torch.export.export(model, inputs)
    windowed, plain = _sdpa_keys(program)
    assert windowed != plain
    # the CPU's two kernels: math for the first call, torch's own choice for the second
    out = decomposed(program, {windowed: "MATH"})
    ops = _attention_ops(out)
    assert ops[0] == "aten._scaled_dot_product_attention_math.default"
    assert ops[1] != ops[0] and "scaled_dot_product_attention.default" not in ops[1]
    with torch.no_grad():
        for got, want in zip(out.module()(*inputs), model(*inputs)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_kernel_replaces_torchs_choice_only_when_clearly_faster():
    assert faster(10.0, {"CUDNN_ATTENTION": 9.0, "EFFICIENT_ATTENTION": 6.0}) == \
        "EFFICIENT_ATTENTION"
    assert faster(10.0, {"EFFICIENT_ATTENTION": 10.0 * MARGIN + 0.01}) is None
    assert faster(10.0, {}) is None


def test_masks_of_weights_alone_are_told_from_masks_read_from_inputs():
    program = torch.export.export(_TwoAttentions().eval(), _inputs())
    masks = [_bound(n.args, n.kwargs)["attn_mask"] for n in program.graph.nodes
             if n.target is torch.ops.aten.scaled_dot_product_attention.default]
    constant = _from_weights_only(program)
    assert masks[0] in constant and masks[1] not in constant


def test_without_a_gpu_nothing_is_timed_or_changed():
    program = torch.export.export(_TwoAttentions().eval(), _inputs())
    timed = []
    result = AttentionKernelsByTiming(timer=lambda call: timed.append(call) or 1.0)(program)
    assert not result.modified and not timed
    assert result.info["attention_calls"] == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_swin_windows_and_vit_rows_keep_eager_values_whatever_kernel_wins():
    class Blocks(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("mask", torch.randn(64, 3, 49, 49))

        def forward(self, q, k, v, x):
            return (F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask + 0),
                    F.scaled_dot_product_attention(x, x, x))

    torch.manual_seed(0)
    model = Blocks().half().cuda().eval()
    inputs = (*(torch.randn(64, 3, 49, 32, device="cuda", dtype=torch.half)
                for _ in range(3)), torch.randn(1, 12, 197, 64, device="cuda",
                                                dtype=torch.half))
    program = torch.export.export(model, inputs)
    result = AttentionKernelsByTiming()(program)
    assert result.info["attention_calls"] == 2 and len(result.info["kernels"]) == 2
    with torch.no_grad():
        for got, want in zip(result.program.module()(*inputs), model(*inputs)):
            torch.testing.assert_close(got.float(), want.float(), rtol=2e-3, atol=2e-3)
