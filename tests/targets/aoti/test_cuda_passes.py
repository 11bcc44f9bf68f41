"""The cuda target's GEMM rewrites: a patch convolution as a GEMM over its patches, and a
linear of unaligned width over a padded weight; a depthwise convolution as its taps, a
grouped one as a batched GEMM, and attention reading its inputs as views of the packed
projection. Graph rewrites checked against eager on the CPU (no GPU needed), marked cuda
with the rest of the target's own tests."""

from __future__ import annotations

import copy

import pytest
import torch

from targets.aoti.passes.aligned_linears import LinearsAlignedByPadding
from targets.aoti.passes.attention_views import AttentionInputsAsViews
from targets.aoti.passes.depthwise_convs import DepthwiseConvsAsTaps
from targets.aoti.passes.grouped_convs import GroupedConvsAsBatchedGemms
from targets.aoti.passes.patch_convs import PatchConvsAsMatmuls

pytestmark = pytest.mark.cuda


class _Stems(torch.nn.Module):
    """A ViT stem on an image its patches do not tile, a bias-free patch conv after it,
    and an overlapping conv that must stay a conv."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = torch.nn.Conv2d(3, 32, 8, 8)
        self.merge = torch.nn.Conv2d(32, 16, (3, 2), (3, 2), bias=False)
        self.overlap = torch.nn.Conv2d(3, 8, 3, 1)

    def forward(self, x):
        return self.merge(self.patch(x)).flatten(1).sum(1) + self.overlap(x).mean()


class _TiedHead(torch.nn.Module):
    """GPT-2's shape: an odd vocabulary, the head tied to the embedding; and a biased
    classifier of 13 labels."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(101, 16)
        self.head = torch.nn.Linear(16, 101, bias=False)
        self.head.weight = self.embed.weight
        self.classes = torch.nn.Linear(16, 13)

    def forward(self, ids):
        hidden = self.embed(ids)
        return self.head(hidden), self.classes(hidden)


class _Depthwise(torch.nn.Module):
    """Depthwise convolutions: padded 7x7, strided 3x3 without bias, a dilated uneven
    kernel; a channel multiplier and a grouped convolution, which must stay convs."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = torch.nn.Conv2d(8, 8, 7, padding=3, groups=8)
        self.strided = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8, bias=False)
        self.dilated = torch.nn.Conv2d(8, 8, (3, 5), stride=(1, 2), padding=(2, 1),
                                       dilation=2, groups=8)
        self.doubled = torch.nn.Conv2d(8, 16, 3, groups=8)
        self.grouped = torch.nn.Conv2d(8, 8, 3, groups=2)

    def forward(self, x):
        return (self.wide(x), self.strided(x), self.dilated(x),
                self.doubled(x).mean() + self.grouped(x).mean())


class _Grouped(torch.nn.Module):
    """RegNet-like group convolutions (12 and 24 channels a group): padded 3x3, strided
    with twice the outputs and no bias, dilated uneven kernel; a depthwise and a plain
    conv, which stay."""

    def __init__(self) -> None:
        super().__init__()
        self.padded = torch.nn.Conv2d(48, 48, 3, padding=1, groups=2)
        self.strided = torch.nn.Conv2d(48, 96, 3, stride=2, padding=1, groups=4, bias=False)
        self.dilated = torch.nn.Conv2d(48, 48, (3, 5), stride=(1, 2), padding=(2, 1),
                                       dilation=2, groups=4)
        self.depthwise = torch.nn.Conv2d(48, 48, 3, padding=1, groups=48)
        self.plain = torch.nn.Conv2d(48, 16, 1)

    def forward(self, x):
        return (self.padded(x), self.strided(x), self.dilated(x),
                self.depthwise(x) + self.plain(x).mean())


class _PackedAttention(torch.nn.Module):
    """torchvision's encoder block's attention: nn.MultiheadAttention over one input."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(64)
        self.attention = torch.nn.MultiheadAttention(64, 4, batch_first=True)

    def forward(self, x):
        y = self.norm(x)
        return x + self.attention(y, y, y, need_weights=False)[0]


def _ops(program) -> list[str]:
    return [str(n.target) for n in program.graph.nodes if n.op == "call_function"]


def test_patch_convolutions_become_gemms_with_eager_values_on_untiled_images():
    torch.manual_seed(0)
    model, x = _Stems().eval(), torch.randn(2, 3, 70, 66)
    result = PatchConvsAsMatmuls()(torch.export.export(model, (x,)))
    assert result.modified and result.info["convs_rewritten"] == 2
    assert _ops(result.program).count("aten.conv2d.default") == 1  # the overlapping one
    fresh = torch.randn(2, 3, 70, 66)
    torch.testing.assert_close(result.program.module()(fresh), model(fresh), atol=1e-4,
                               rtol=1e-4)


def test_unaligned_head_reads_one_padded_copy_shared_with_its_tied_embedding():
    torch.manual_seed(0)
    model, ids = _TiedHead().eval(), torch.randint(0, 101, (1, 7))
    result = LinearsAlignedByPadding()(torch.export.export(model, (ids,)))
    assert result.modified and result.info["linears_padded"] == 2
    shapes = sorted(tuple(t.shape) for t in result.program.state_dict.values())
    assert shapes == [(16,), (16, 16), (104, 16)]  # one table: head and embedding share it
    fresh = torch.tensor([[0, 100, 57, 3, 99, 1, 64]])  # the first and last ids too
    for got, want in zip(result.program.module()(fresh), model(fresh)):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dtype, atol, rtol", [(torch.bfloat16, 0.05, 0.02),
                                              (torch.float16, 5e-3, 2e-3)])
@pytest.mark.parametrize("make, rewrite, figure, channels", [
    (_Depthwise, DepthwiseConvsAsTaps, "depthwise_convs_rewritten", 8),
    (_Grouped, GroupedConvsAsBatchedGemms, "grouped_convs_rewritten", 48)],
    ids=["depthwise_as_taps", "grouped_as_batched_gemms"])
def test_convolutions_rewritten_with_eager_values_other_convs_stay(make, rewrite, figure,
                                                                    channels, dtype, atol, rtol):
    torch.manual_seed(0)
    model, x = make().eval().to(dtype), torch.randn(2, channels, 15, 13, dtype=dtype)
    result = rewrite()(torch.export.export(model, (x,)))
    assert result.modified and result.info[figure] == 3
    assert _ops(result.program).count("aten.conv2d.default") == 2
    fresh = torch.randn(2, channels, 15, 13).to(dtype)
    got = result.program.module()(fresh)
    with torch.no_grad():  # against eager in float32 on the same half-precision weights
        want = copy.deepcopy(model).float()(fresh.float())
    for tensor, expected in zip(got, want):
        assert tensor.dtype == dtype and tensor.shape == expected.shape
        torch.testing.assert_close(tensor.float(), expected, atol=atol, rtol=rtol)


def test_depthwise_convolution_is_a_few_nodes_whatever_its_kernel_size():
    def nodes(kernel: int) -> int:
        conv = torch.nn.Conv2d(16, 16, kernel, padding=kernel // 2, groups=16).eval().half()
        image = torch.randn(1, 16, 14, 14, dtype=torch.half)
        result = DepthwiseConvsAsTaps()(torch.export.export(conv, (image,)))
        assert result.modified
        return len(_ops(result.program))
    assert nodes(3) == nodes(7) <= 20  # the first form: 297 nodes a 7x7


def test_float32_depthwise_convolution_stays_cudnns():
    conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8).eval()
    result = DepthwiseConvsAsTaps()(torch.export.export(conv, (torch.randn(1, 8, 9, 9),)))
    assert not result.modified


def test_depthwise_convolution_with_much_work_stays_cudnns():
    wide = torch.nn.Conv2d(96, 96, 7, padding=3, groups=96).eval().half()  # ConvNeXt's stage 1
    image = torch.randn(1, 96, 56, 56, dtype=torch.half)
    result = DepthwiseConvsAsTaps()(torch.export.export(wide, (image,)))
    assert not result.modified


@pytest.mark.parametrize("batch", [1, 3])
def test_packed_attention_reads_views_not_a_copy_at_any_batch(batch):
    torch.manual_seed(0)
    model, x = _PackedAttention().eval(), torch.randn(batch, 5, 64)
    with torch.no_grad():
        result = AttentionInputsAsViews()(torch.export.export(model, (x,)))
    assert result.modified and result.info["copies_dropped"] == 1
    assert not {"aten.contiguous.default", "aten.clone.default"} & set(_ops(result.program))
    fresh = torch.randn(batch, 5, 64)
    torch.testing.assert_close(result.program.module()(fresh), model(fresh))


def test_copy_read_by_more_than_attention_inputs_stays():
    class Leaky(torch.nn.Module):
        def forward(self, x):
            packed = x.contiguous()
            q = packed.view(1, 2, 5, 8)
            out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
            return out, packed  # the copy itself is an output: it must stay its own tensor

    x = torch.randn(5, 2, 8).transpose(0, 1)
    result = AttentionInputsAsViews()(torch.export.export(Leaky(), (x,)))
    assert not result.modified


def test_cuda_target_rewrites_gemms_before_the_single_row_linears(tmp_path):
    from targets import get_target
    from targets.base import LowerOptions
    cuda = get_target("cuda")

    def names(**options) -> list[str]:
        return [p.name for p in cuda.default_passes(LowerOptions(tmp_path, **options))]
    assert {"patch_convs_as_matmuls", "linears_aligned_by_padding",
            "attention_inputs_as_views"} <= set(names())
    assert {"depthwise_convs_as_taps", "grouped_convs_as_batched_gemms",
            "tanh_gelu_as_gemm_epilogue"} <= set(names())
    assert names().index("grouped_convs_as_batched_gemms") < names().index(
        "attention_inputs_as_views")
    assert "tanh_gelu_as_gemm_epilogue" not in names(shared_weights=True)  # generating
    assert "patch_convs_as_matmuls" not in names(fuse=False)
    assert names()[-1] == "single_row_linears_as_reductions"


@pytest.mark.parametrize("conv, dtype", [
    (torch.nn.Conv2d(48, 48, 3, padding=1, groups=2), torch.float32),  # not measured
    (torch.nn.Conv2d(64, 64, 3, padding=1, groups=8), torch.float16),  # 8 a group: ResNeXt's
], ids=["float32", "power_of_two_group"])
def test_float32_and_power_of_two_groups_stay_cudnns(conv, dtype):
    conv, image = conv.eval().to(dtype), torch.randn(1, conv.in_channels, 9, 9, dtype=dtype)
    result = GroupedConvsAsBatchedGemms()(torch.export.export(conv, (image,)))
    assert not result.modified
