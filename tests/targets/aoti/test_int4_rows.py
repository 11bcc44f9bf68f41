"""The cuda target's int4 rows (targets/aoti/kernels/int4_rows.py): the format against
the float weight, the int4-weight recipe's products becoming row_gemv over the packed rows
with the decode step's folds (checked on the CPU through the reference kernels), and the
Triton kernel against the reference math (on a GPU, or on the CPU under Triton's
interpreter with TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels import int4_rows, reference
from tests.helpers import triton_device
from tests.targets.aoti.test_decode_kernels import _calls, _captured, _randomised, ops_row_gemv

pytest.importorskip("transformers")


def test_int4_rows_stand_for_the_weight_within_a_step_of_each_group():
    """Each weight comes back within half a step (scale / 2) of its group's range, the
    low nibble holding a group's first half and the high one its second."""
    torch.manual_seed(0)
    weight = torch.randn(24, 256) * 0.05
    packed, scales = int4_rows.pack(weight, 128)
    assert packed.dtype == torch.uint8 and packed.shape == (24, 128)
    assert scales.shape == (24, 2, 2)
    back = reference.int4_weight(packed, scales)
    step = scales[..., 0].repeat_interleave(128, dim=1)
    assert ((back - weight).abs() <= step / 2 + 1e-6).all()
    q = (packed[0, 0] & 15, packed[0, 0] >> 4)  # columns 0 and 64 of row 0
    for nibble, col in zip(q, (0, 64)):
        assert torch.isclose(nibble.float() * scales[0, 0, 0] + scales[0, 0, 1],
                             back[0, col])


def _quantized_int4(family: str):
    from passes.quantize.quantize_weight_only import QuantizeWeightOnly
    from targets.aoti.passes.decode_kernels import DecodeAttentionAsKernel
    program, past = _captured(family, 1)
    program = DecodeAttentionAsKernel()(program).program
    quantize = QuantizeWeightOnly("int4-weight", "weight-only", "cuda",
                                  swap_linear=int4_rows.swap, layout=int4_rows.LAYOUT)
    return quantize(program), past


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_int4_weight_products_become_the_kernel_over_int4_rows(family):
    """With the cuda target's int4 rows each product is one int4_linear, and in a decode
    step one row_gemv over the packed rows, the norm, gated activation, Qwen's q/k/v bias,
    rotary and residual folded in as for float weights; the step computes what the
    quantized program did, and that stays near the float one."""
    from targets.aoti.passes.decode_kernels import RowLinearsAsKernels
    quantized, past = _quantized_int4(family)
    assert quantized.info["layout"] == int4_rows.LAYOUT
    assert quantized.info["layers_float"] == []
    result = RowLinearsAsKernels()(quantized.program)
    layers = 2
    folds = {"linears_as_kernels": 4 * layers + 1, "int8_linears": 0,
             "int4_linears": 4 * layers + 1, "norms_folded": 2 * layers + 1,
             "gated_folded": layers, "residuals_folded": 2 * layers, "rotary_folded": layers}
    assert {name: result.info[name] for name in folds} == folds
    assert not {"edge_exporter.int4_linear.default", "aten.silu.default"} & set(
        _calls(result.program))
    int4 = _row_gemvs_over(result.program, torch.uint8)  # each with its groups' scales
    assert len(int4) == 4 * layers + 1 and None not in [n.args[8] for n in int4]
    biased = [n for n in int4 if n.args[2] is not None]  # Qwen's q/k/v bias
    assert len(biased) == (layers if family == "qwen2" else 0)
    cache = _randomised(past)
    ids, position = torch.tensor([[7]]), torch.tensor([9])
    with torch.no_grad():
        want = quantized.program.module()(ids, position, *cache.values())
        got = result.program.module()(ids, position, *cache.values())
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-4)


def _row_gemvs_over(program, dtype: torch.dtype) -> list:
    stored = {n.name: n.meta["val"].dtype for n in program.graph.nodes if n.op == "placeholder"}
    return [n for n in program.graph.nodes
            if n.target == ops_row_gemv() and stored[n.args[1].name] == dtype]


def test_prompt_rows_keep_the_int4_linear():
    """A prefill chunk (rows of dynamic count) keeps int4_linear: its body, the unpacked
    weight's linear, is what Inductor compiles there."""
    from passes.quantize.quantize_weight_only import QuantizeWeightOnly
    from targets.aoti.passes.decode_kernels import RowLinearsAsKernels
    program, _ = _captured("llama", 4)
    quantized = QuantizeWeightOnly("int4-weight", "weight-only", "cuda",
                                   swap_linear=int4_rows.swap)(program).program
    assert _calls(quantized)["edge_exporter.int4_linear.default"] == 4 * 2 + 1
    assert not RowLinearsAsKernels()(quantized).modified


@pytest.mark.cuda
@pytest.mark.parametrize("config", [None, (2, 1, 4), (8, 4, 4), (4, 16, 8),
                                    (2, 1, 4, True), (4, 16, 8, False)])  # + both dots
@pytest.mark.parametrize("case", [  # (N, K, group, norm, act, residual, bias)
    (37, 256, 128, True, 1, False, True), (2560, 2048, 128, True, 0, False, False),
    (64, 5632, 128, False, 0, True, True), (48, 96, 32, True, 1, True, False)])
def test_int4_row_gemv_kernel_matches_its_reference(case, config):
    """fp16 rows against int4 rows: odd row counts, a group count no block divides, every
    fold, plain and with the rows' blocks given."""
    device = triton_device()
    from targets.aoti.kernels.int4_triton import launch_int4_row_gemv
    n, k, group, norm, act, res, bias = case
    torch.manual_seed(n + k)
    dtype = dict(device=device, dtype=torch.float16)
    rows = 2 * n if act else n
    packed, scales = int4_rows.pack(torch.randn(rows, k, **dtype) * 0.05, group)
    x = torch.randn(1, 1, k, **dtype)
    args = (torch.randn(rows, **dtype) if bias else None,
            torch.rand(k, **dtype) + 0.5 if norm else None,
            torch.randn(1, 1, n, **dtype) if res else None, 1e-6, 0.0, act)
    want = reference.row_gemv(x, packed, *args, weight_scale=scales).float()
    got = launch_int4_row_gemv(x, packed, scales, *args, config=config)
    assert got.dtype == torch.float16 and got.shape == want.shape
    assert ((got.float() - want).norm() / want.norm()).item() < 2e-3


@pytest.mark.cuda
@pytest.mark.parametrize("config", [None, (2, 1, 4, True), (2, 1, 4, False)])
def test_int4_row_gemv_kernel_reads_every_byte_value_exactly(config):
    """Row r's bytes all hold r (q = r & 15 in the first half, r >> 4 in the second), x
    is 1 then 2, scale 1 and offset 0: every sum is a small integer, so any unpacking that
    loses or moves a nibble shows as an exact mismatch."""
    device = triton_device()
    from targets.aoti.kernels.int4_triton import launch_int4_row_gemv
    values = torch.arange(256, device=device)
    packed = values[:, None].repeat(1, 128).to(torch.uint8)  # K = 256: two groups
    scales = torch.tensor([1.0, 0.0], device=device, dtype=torch.float16).repeat(256, 2, 1)
    x = torch.ones(1, 1, 256, device=device, dtype=torch.float16)
    x[..., 64:128] = 2.0
    x[..., 192:] = 2.0
    got = launch_int4_row_gemv(x, packed, scales, None, None, None, 1e-6, 0.0, 0,
                               config=config)
    want = 2 * 64 * (values & 15) + 2 * 2 * 64 * (values >> 4)
    assert torch.equal(got.float().reshape(-1), want.float())


@pytest.mark.cuda
@pytest.mark.parametrize("config", [None, (4, 2, 4, True), (4, 2, 4, False)])
def test_int4_row_gemv_kernel_rotates_the_first_rows_as_its_reference(config):
    device = triton_device()
    from targets.aoti.kernels.int4_triton import launch_int4_row_gemv
    heads, kv_heads, dim, k = 8, 2, 64, 256
    torch.manual_seed(dim)
    dtype = dict(device=device, dtype=torch.float16)
    rotated = (heads + kv_heads) * dim
    packed, scales = int4_rows.pack(torch.randn(rotated + kv_heads * dim, k, **dtype) * 0.05,
                                    128)
    x = torch.randn(1, 1, k, **dtype)
    angle = 9.0 / 10000 ** (torch.arange(0, dim, 2, device=device) / dim)
    cos, sin = (f(torch.cat([angle, angle])).half().view(1, 1, 1, dim)
                for f in (torch.cos, torch.sin))
    args = (None, torch.rand(k, **dtype) + 0.5, None, 1e-6, 0.0, 0)
    turn = dict(rotary_cos=cos, rotary_sin=sin, rotary_rows=rotated, head_dim=dim)
    want = reference.row_gemv(x, packed, *args, weight_scale=scales, **turn).float()
    got = launch_int4_row_gemv(x, packed, scales, *args, config=config, **turn).float()
    assert ((got - want).norm() / want.norm()).item() < 2e-3


def test_cuda_int4_weight_is_int4_rows_unless_tinygemm_is_asked_for(monkeypatch, tmp_path):
    """int4 rows are the cuda default: the rows' swap and layout reach the quantize pass;
    with EDGE_EXPORTER_INT4_ROWS=0 the recipe keeps torchao's format."""
    from targets.aoti.cuda import CudaTarget
    from targets.options import LowerOptions

    quantization = CudaTarget.quantization
    options = LowerOptions(work_dir=tmp_path, quantize="int4-weight")
    monkeypatch.delenv(int4_rows.ROWS_ENV, raising=False)
    assert quantization.linear_format("int4-weight") == (int4_rows.swap, int4_rows.LAYOUT)
    assert quantization.quantize_pass(options, "cuda").layout == int4_rows.LAYOUT
    monkeypatch.setenv(int4_rows.ROWS_ENV, "0")
    assert quantization.linear_format("int4-weight") == (None, "")
    assert quantization.quantize_pass(options, "cuda").swap_linear is None
    assert quantization.linear_format("int8-weight") == (None, "")


def test_frozen_libraries_keep_int4_rows_packed():
    """Inductor's freezing (a plain build) folds what reads only constants into new
    constants: int4_linear's unpack became the float weight in the library (on the CPU,
    one 1024x2048 linear's library 9.9 MB, 2.9 MB with the rows kept packed). With the
    nibble ops kept from folding, no float constant of the weight's size is made."""
    from torch._inductor.constant_folding import constant_fold
    from torch.fx.experimental.proxy_tensor import make_fx
    packed, scales = int4_rows.pack(torch.randn(64, 256), 128)
    int4_rows.keep_rows_packed()
    module = make_fx(lambda x: int4_rows._int4_linear(x, packed, scales))(torch.randn(2, 256))
    constant_fold(module)
    stored = [getattr(module, n.target) for n in module.graph.nodes if n.op == "get_attr"]
    assert any(t.dtype == torch.uint8 for t in stored)  # the rows, as packed
    assert not [t for t in stored if t.is_floating_point() and t.numel() >= 64 * 256]
