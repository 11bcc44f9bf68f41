"""int4_triton.py's ``x_qblock``: int4 rows against x's int8 codes in blocks of that many
columns, a word's nibbles masked in place and four a dp4a (``dp4a.u32.s32``), against
reference.row_gemv (with and without its ``x_qblock``) over every fold. Under
TRITON_INTERPRET=1 on the CPU (dp4a as byte products), or on a GPU (the PTX)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import triton_device

pytest.importorskip("triton")


def _made(*size, seed, scale=1.0, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(size, generator=generator) * scale).to(device, torch.float16)


def _packed(rows: int, cols: int, group: int, seed: int, device):
    from targets.aoti.kernels import int4_rows
    generator = torch.Generator().manual_seed(seed)
    packed, scales = int4_rows.pack(torch.randn(rows, cols, generator=generator) * 0.05,
                                    group)
    return packed.to(device), scales.to(device)


def test_codes_that_are_exact_give_exact_integer_sums():
    """x of integers with 127 or -127 in every block of 32 (codes x itself, scales 1) and
    integer weights (scale 1, offset -8): every sum is the exact integer product, so a
    nibble lost, moved or read with the wrong sign, or a code sum off, differs."""
    device = triton_device()
    from targets.aoti.kernels.int4_triton import launch_int4_row_gemv
    from targets.aoti.kernels.reference import int4_weight
    rows = torch.arange(24)
    packed = ((rows[:, None] * 37 + 11 * torch.arange(128)) % 256).to(torch.uint8)
    scales = torch.tensor([1.0, -8.0]).repeat(24, 2, 1)  # groups of 128, K = 256
    cols = torch.arange(256)
    x = ((cols * 53) % 255 - 127).float()
    x[::32] = torch.where(torch.arange(8) % 2 == 0, 127.0, -127.0)
    want = int4_weight(packed, scales).double() @ x.double()
    for config in [(4, 2, 4), (2, 1, 4), (8, 2, 8)]:
        got = launch_int4_row_gemv(x.reshape(1, 1, 256).to(device), packed.to(device),
                                   scales.to(device), None, None, None, 1e-6, 0.0, 0,
                                   config, x_qblock=32)
        assert torch.equal(got.double().reshape(-1).cpu(), want), config


@pytest.mark.parametrize("n, k, group, act, norm, res, bias, config, qblock", [
    (40, 256, 128, 1, True, False, False, (4, 1, 4), 32),  # gate/up: the norm, 2 steps
    (36, 384, 128, 0, True, False, True, (4, 2, 4), 64),  # bias, a step of 1 of 2 groups
    (40, 256, 128, 0, True, False, False, (8, 2, 4), 16),  # the head's fold, one step
    (41, 96, 32, 0, False, True, False, (4, 2, 4), 16),  # a residual, groups of 32
    (24, 512, 128, 1, True, True, True, (16, 2, 8), 32),  # gated, bias, residual
])
def test_products_over_x_codes_are_row_gemvs_of_the_quantized_x(n, k, group, act, norm,
                                                                  res, bias, config, qblock):
    """The kernel's sums are reference.row_gemv's over x quantized as it says (tight), and
    within int8 activations' error of the float product (loose)."""
    device = triton_device()
    from targets.aoti.kernels.int4_triton import launch_int4_row_gemv
    from targets.aoti.kernels.reference import row_gemv
    rows = 2 * n if act else n
    packed, scales = _packed(rows, k, group, 6, device)
    x = _made(1, 1, k, seed=1, device=device)
    nw = _made(k, seed=2, scale=0.1, device=device) + 1.0 if norm else None
    r = _made(1, 1, n, seed=3, device=device) if res else None
    b = _made(rows, seed=4, scale=0.1, device=device) if bias else None
    args = (b, nw, r, 1e-5, 0.0, act)
    got = launch_int4_row_gemv(x, packed, scales, *args, config, x_qblock=qblock).float()
    quantized = row_gemv(x, packed, *args, scales, x_qblock=qblock).float()
    exact = row_gemv(x, packed, *args, scales).float()
    top = max(1.0, exact.abs().max().item())
    assert (got - quantized).abs().max().item() <= 2e-3 * top
    assert not torch.equal(quantized, exact)  # the codes are not x itself
    assert ((got - exact).norm() / exact.norm()).item() < 3e-2


def test_q_and_k_rows_are_rotated_as_the_reference():
    """q/k/v's fold: the norm and the rotary embedding of q's and k's rows."""
    device = triton_device()
    from targets.aoti.kernels.int4_triton import launch_int4_row_gemv
    from targets.aoti.kernels.reference import row_gemv
    heads, kv_heads, dim, k = 4, 2, 16, 256
    rotated = (heads + kv_heads) * dim
    packed, scales = _packed(rotated + kv_heads * dim, k, 128, 8, device)
    x = _made(1, 1, k, seed=5, device=device)
    angle = 9.0 / 10000 ** (torch.arange(0, dim, 2) / dim)
    cos, sin = (f(torch.cat([angle, angle])).half().view(1, 1, 1, dim).to(device)
                for f in (torch.cos, torch.sin))
    args = (None, _made(k, seed=6, scale=0.1, device=device) + 1.0, None, 1e-5, 0.0, 0)
    turn = dict(rotary_cos=cos, rotary_sin=sin, rotary_rows=rotated, head_dim=dim)
    got = launch_int4_row_gemv(x, packed, scales, *args, config=(4, 2, 4), x_qblock=32,
                               **turn).float()
    want = row_gemv(x, packed, *args, weight_scale=scales, x_qblock=32, **turn).float()
    assert (got - want).abs().max().item() <= 2e-3 * max(1.0, want.abs().max().item())


def test_every_configuration_computes_the_same_codes():
    """x's blocks are the kernel's, not its steps': the sums agree across configurations
    (to fp32 summation order), as they would not if a step chose its own scale."""
    device = triton_device()
    from targets.aoti.kernels.int4_triton import launch_int4_row_gemv
    packed, scales = _packed(32, 512, 128, 2, device)
    x = _made(1, 1, 512, seed=7, device=device)
    x[..., 200] = 40.0  # one outlier: its block's scale alone grows
    runs = [launch_int4_row_gemv(x, packed, scales, None, None, None, 1e-6, 0.0, 0, config,
                                 x_qblock=32).float()
            for config in [(4, 1, 4), (8, 4, 4), (2, 2, 4), (16, 4, 8)]]
    for run in runs[1:]:
        assert (run - runs[0]).abs().max().item() <= 1e-3 * runs[0].abs().max().item()


@pytest.mark.parametrize("qblock, group", [(24, 128), (8, 128), (128, 128), (32, 32)])
def test_blocks_that_do_not_fit_are_refused(qblock, group):
    """A block is a power of two, a thread's chunk (16 columns) at least, and within half
    a group (the nibbles' half) at most."""
    from targets.aoti.kernels.int4_triton import launch_int4_row_gemv, qblock_fits
    assert not qblock_fits(qblock, group)
    assert qblock_fits(16, 32) and qblock_fits(64, 128)
    packed = torch.zeros(8, 128, dtype=torch.uint8)
    scales = torch.ones(8, 256 // group, 2)
    with pytest.raises(ValueError, match=f"x in blocks of {qblock} columns"):
        launch_int4_row_gemv(torch.zeros(1, 1, 256), packed, scales, None, None, None,
                             1e-6, 0.0, 0, x_qblock=qblock)
