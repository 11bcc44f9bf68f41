"""bench/int4_rows_pairs.py: the int4-row product in fp16 pairs with rows a thread
computes reference.row_gemv (every fold), its magic numbers decode every nibble exactly,
and its fp16 partial sums stay within a stated error at the ~1.1B's scales. Under
``TRITON_INTERPRET=1`` the pairs' PTX is emulated in fp32 (same lanes and layout); on a
GPU the PTX itself runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers import triton_device


def test_the_magic_numbers_leave_q_minus_8_for_every_nibble():
    """(w & 0x000f000f) | 0x64006400 - 1032 and ((w & 0x00f000f0) | 0x64006400) / 16 - 72,
    as fp16 pairs, are q - 8 for both nibbles of both bytes of a pair."""
    q = np.arange(256, dtype=np.uint32)  # byte values: low nibble, high nibble
    words = q | (q[::-1] << 16)
    low = ((words & 0x000F000F) | 0x64006400).view(np.float16).reshape(-1, 2)
    high = ((words & 0x00F000F0) | 0x64006400).view(np.float16).reshape(-1, 2)
    want_low = np.stack([q & 15, q[::-1] & 15], 1).astype(np.float16) - 8
    want_high = np.stack([q >> 4, q[::-1] >> 4], 1).astype(np.float16) - 8
    assert np.array_equal(low - np.float16(1032), want_low)
    one_16, minus_72 = np.float16(0.0625), np.float16(-72)
    assert np.array_equal((high.astype(np.float32) * one_16 + minus_72).astype(np.float16),
                          want_high)


def _case(device, rows, cols, norm=False, act=0, residual=False, rotary=0, offset=0.0,
          bias=False, seed=0):
    from targets.aoti.kernels import int4_rows, reference
    from bench.int4_rows_pairs import launch_int4_pairs
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows * (2 if act else 1), cols, generator=g) * 0.05
    packed, scales = int4_rows.pack(weight.half(), 128)
    x = torch.randn(1, cols, generator=g).half()
    nw = (torch.rand(cols, generator=g) + 0.5).half() if norm else None
    res = torch.randn(1, rows, generator=g).half() if residual else None
    b = torch.randn(rows * (2 if act else 1), generator=g).half() if bias else None
    cos = sin = None
    if rotary:
        from bench.decode_chain_int4 import rotary_tables
        cos, sin = rotary_tables(16, "cpu")
    moved = [t if t is None else t.to(device) for t in (x, packed, scales, b, nw, res, cos, sin)]
    x_, packed_, scales_, b_, nw_, res_, cos_, sin_ = moved
    got = launch_int4_pairs(x_, packed_, scales_, b_, nw_, res_, 1e-5, offset, act,
                            (4, 2, 1), False, cos_, sin_, rotary, 16 if rotary else 0)
    want = reference.row_gemv(x, packed, b, nw, res, 1e-5, offset, act, scales,
                              rotary_cos=cos, rotary_sin=sin, rotary_rows=rotary,
                              head_dim=16 if rotary else 0)
    return got.float().cpu(), want.float()


@pytest.mark.parametrize("shape", [
    dict(rows=8, cols=256), dict(rows=12, cols=384, norm=True, residual=True),
    dict(rows=8, cols=512, norm=True, act=1), dict(rows=32, cols=256, norm=True, rotary=16),
    dict(rows=6, cols=640, norm=True, offset=1.0, bias=True)])
def test_pairs_compute_what_the_reference_computes(shape):
    """Rows past N, groups past K (384, 640 columns: steps of 2 groups), the norm with and
    without its offset, bias, SiLU x up, rotary rows, the residual. Tolerance: the output's
    fp16 rounding plus the fp16 pair sums' (2e-3 of the largest output)."""
    got, want = _case(triton_device(), **shape)
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= 2e-3 * want.abs().max().item() + 1e-3


def test_pairs_refuse_what_they_do_not_cover():
    pytest.importorskip("triton")
    from targets.aoti.kernels import int4_rows
    from bench.int4_rows_pairs import launch_int4_pairs
    packed, scales = int4_rows.pack(torch.randn(4, 256).half(), 64)
    with pytest.raises(ValueError, match="groups of 128"):
        launch_int4_pairs(torch.randn(1, 256).half(), packed, scales, None, None, None,
                          1e-5, 0.0, 0)


def fp16_pair_error(cols: int, x_scale: float, seed: int = 0) -> float:
    """max |the kernel's sums with its fp16 lanes emulated - fp32 sums| over 64 rows,
    relative to the fp32 sums' largest: weights as the ~1.1B's (std 0.02, int4 rows),
    x ~ N(0, x_scale) with a few columns at 100 x_scale (its outliers)."""
    from targets.aoti.kernels import int4_rows, reference
    g = torch.Generator().manual_seed(seed)
    packed, scales = int4_rows.pack((torch.randn(64, cols, generator=g) * 0.02).half(), 128)
    x = torch.randn(cols, generator=g) * x_scale
    x[torch.randint(0, cols, (8,), generator=g)] *= 100
    x = x.half().float()
    want = reference.int4_weight(packed, scales) @ x
    q = torch.cat([packed.reshape(64, -1, 64) & 15, packed.reshape(64, -1, 64) >> 4],
                  -1).float() - 8  # [rows, groups, 128]
    xg = x.reshape(-1, 128)
    lanes = torch.zeros(64, cols // 128, 4, 4, dtype=torch.float16)  # quarter, lane
    for k in range(4):  # a quarter's words in order; two products a lane a word
        for half, lane_pair in ((0, (0, 1)), (64, (2, 3))):
            for byte in range(4):
                col = half + torch.arange(4) * 16 + 4 * k + byte  # each quarter's column
                lane = lane_pair[byte // 2]
                lanes[..., lane] = (q[:, :, col] * xg[:, col] + lanes[..., lane].float()).half()
    dot = lanes.float().sum((-1, -2))  # [rows, groups]
    got = (dot * scales[..., 0].float()
           + (scales[..., 1].float() + 8 * scales[..., 0].float()) * xg.sum(-1)).sum(-1)
    return ((got - want).abs().max() / want.abs().max()).item()


def test_fp16_pair_sums_stay_within_their_bound_at_the_1_1bs_scales():
    """Emulated lanes (each HFMA2 rounded to fp16): within 2e-3 of the largest sum for
    the ~1.1B's columns (2048, down's 5632) and x from 0.1 to 5 (outliers to 500)."""
    for cols in (2048, 5632):
        for x_scale in (0.1, 1.0, 5.0):
            assert fp16_pair_error(cols, x_scale) < 2e-3


def _chain_128(monkeypatch, device):
    """decode_chain_cuda's chain at hidden 128 (groups of 128 need it): 8 heads of 16 over
    2 key/value heads, 128 intermediate columns, 100 vocabulary rows, its rows int4."""
    from bench import decode_chain_cuda as chain
    from targets.aoti.kernels import int4_rows
    for name, value in dict(HIDDEN=128, KV=32, HEADS=8, KV_HEADS=2, DIM=16).items():
        monkeypatch.setattr(chain, name, value)
    g = torch.Generator().manual_seed(5)

    def made(*size, scale=0.1):
        return (torch.randn(size, generator=g) * scale).to(device, torch.float16)

    def w(rows, cols):
        return int4_rows.pack(made(rows, cols), 128)
    weights = {"layers": [{
        "qkv": w(192, 128), "o": w(128, 128), "gate_up": w(256, 128), "down": w(128, 128),
        "k": made(1, 2, 8, 16, scale=1.0), "v": made(1, 2, 8, 16, scale=1.0)}],
        "head": w(100, 128), "norm": made(128, scale=0.1) + 1.0,
        "mask": torch.zeros(1, 1, 1, 9, device=device, dtype=torch.float16),
        "counts": torch.zeros(2, device=device, dtype=torch.int32)}
    return chain, weights, made(1, 1, 128, scale=1.0)


@pytest.mark.parametrize("name", ["pairs"])
def test_a_pairs_variant_computes_what_the_int4_chain_computes(monkeypatch, name):
    """decode_chain_int4's pairs variants against its default launches over the same
    rows, q and k rotated in both (1e-2 of the largest logit: fp16 sums over a layer)."""
    device = triton_device()
    from bench.decode_chain_int4 import CHANGES, launches, rotary_tables
    chain, weights, hidden = _chain_128(monkeypatch, device)
    rotary = (*rotary_tables(16, device), 160, 16)
    want = chain.step(weights, hidden, False, launches({}, rotary), join=True).float()
    got = chain.step(weights, hidden, False, launches(CHANGES[name], rotary), join=True)
    assert (got.float() - want).abs().max().item() <= 1e-2 * want.abs().max().item()
