"""int8_dot4_triton.py through int8_words_triton's launch: int8 rows against x's int8
codes in blocks of ``x_qblock`` columns, four products a dp4a, against
reference.row_gemv (with and without its ``x_qblock``) over every fold. Under
TRITON_INTERPRET=1 on the CPU (dp4a as byte products), or on a GPU (the PTX)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import triton_device
from tests.targets.aoti.test_int8_words import _made, operands

pytest.importorskip("triton")


def exact_codes(width: int, rows: int = 24):
    """(int8 rows, x, their float64 product): every byte value across the rows, x of
    integers with 127 or -127 in every block of 32 columns, so each code is x itself and
    each scale 1, and a kernel's sums are that product exactly."""
    cols = torch.arange(width)
    weight = ((torch.arange(rows)[:, None] * 37 + 11 * cols) % 256 - 128).to(torch.int8)
    x = ((cols * 53) % 255 - 127).float()
    x[::32] = torch.where(torch.arange(width // 32) % 2 == 0, 127.0, -127.0)
    return weight, x, weight.double() @ x.double()


def test_codes_that_are_exact_give_exact_integer_sums():
    """Exact codes (exact_codes): every sum is the exact integer product; a byte lost,
    moved or read with the wrong sign (in the weights or in x's packed codes) differs."""
    device = triton_device()
    from targets.aoti.kernels.int8_words_triton import launch_int8_words
    weight, x, want = exact_codes(256)
    for config in [(4, 64, 4, 0), (2, 128, 4, 64), (8, 32, 4, 256)]:
        got = launch_int8_words(x.reshape(1, 1, 256).to(device), weight.to(device), None,
                                None, None, 1e-6, 0.0, 0, torch.ones(24, device=device),
                                config, x_qblock=32)
        assert torch.equal(got.double().reshape(-1).cpu(), want), config


@pytest.mark.parametrize("n, k, act, norm, res, bias, config, qblock", [
    (40, 96, 1, True, False, False, (4, 32, 4, 0), 32),  # gate/up: the norm, 3 tiles
    (36, 128, 0, True, False, True, (4, 64, 4, 128), 32),  # q/k/v with bias, all ahead
    (40, 256, 0, True, False, False, (8, 128, 4, 128), 64),  # head: the first tile ahead
    (41, 64, 0, False, True, False, (4, 32, 4, 0), 16),  # a residual, a part block
    (24, 256, 1, True, True, True, (16, 128, 8, 128), 128),  # gated, ahead, bias, residual
])
def test_products_over_x_codes_are_row_gemvs_of_the_quantized_x(n, k, act, norm, res,
                                                                  bias, config, qblock):
    """The kernel's sums are reference.row_gemv's over x quantized as it says (tight), and
    within int8 activations' error of the float product (loose)."""
    device = triton_device()
    from targets.aoti.kernels.int8_words_triton import launch_int8_words
    from targets.aoti.kernels.reference import row_gemv
    x, weight, scale, nw, r, b = operands(n, k, act, norm, res, bias, device, low=-127)
    got = launch_int8_words(x, weight, b, nw, r, 1e-5, 0.0, act, scale, config,
                            x_qblock=qblock).float()
    quantized = row_gemv(x, weight, b, nw, r, 1e-5, 0.0, act, scale, x_qblock=qblock).float()
    exact = row_gemv(x, weight, b, nw, r, 1e-5, 0.0, act, scale).float()
    top = max(1.0, exact.abs().max().item())
    assert (got - quantized).abs().max().item() <= 2e-3 * top
    assert not torch.equal(quantized, exact)  # the codes are not x itself
    assert ((got - exact).norm() / exact.norm()).item() < 2e-2


def test_every_configuration_computes_the_same_codes():
    """x's blocks are the kernel's, not its tiles': the sums agree across shapes (to fp32
    summation order), as they would not if a tile chose its own scale."""
    device = triton_device()
    from targets.aoti.kernels.int8_words_triton import launch_int8_words
    generator = torch.Generator().manual_seed(2)
    weight = torch.randint(-127, 128, (32, 512), generator=generator, dtype=torch.int8)
    weight = weight.to(device)
    scale = torch.full((32,), 1e-2, device=device)
    x = _made(1, 1, 512, seed=7, device=device)
    x[..., 200] = 40.0  # one outlier: its block's scale alone grows
    runs = [launch_int8_words(x, weight, None, None, None, 1e-6, 0.0, 0, scale, config,
                              x_qblock=32).float()
            for config in [(4, 32, 4, 0), (8, 256, 4, 0), (2, 128, 4, 256), (16, 512, 8, 0)]]
    for run in runs[1:]:
        assert (run - runs[0]).abs().max().item() <= 1e-3 * runs[0].abs().max().item()


def test_blocks_that_do_not_fit_are_refused():
    from targets.aoti.kernels.int8_words_triton import launch_int8_words, words_fit
    rows = torch.zeros(8, 96, dtype=torch.int8)
    assert words_fit(rows, (4, 32, 4, 0), 32)
    assert not words_fit(rows, (4, 32, 4, 0), 64)  # 96 columns: not whole blocks
    assert not words_fit(rows, (4, 16, 4, 0), 32)  # a tile of half a block
    assert not words_fit(rows, (4, 32, 4, 16), 32)  # columns ahead of half a block
    assert not words_fit(rows, (4, 32, 4, 0), 24)  # not a power of two
    with pytest.raises(ValueError, match="x in blocks of 64"):
        launch_int8_words(torch.zeros(1, 1, 96), rows, None, None, None, 1e-6, 0.0, 0,
                          torch.ones(8), (4, 32, 4, 0), x_qblock=64)


@pytest.mark.parametrize("config", [
    (8, 64, 4, 64, False, 0, 4),  # split along K
    (4, 64, 4, 64, False, 2),  # the row loop
    (4, 64, 4, 64, False, 0, 0, 4),  # pipelined
    (4, 64, 4, 64, True),  # x as one tile
])
def test_row_gemv_takes_x_codes_through_the_one_block_kernel_only(config):
    """launch_row_gemv with ``x_qblock`` refuses any other kernel's configuration before
    it launches."""
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    rows = torch.zeros(16, 256, dtype=torch.int8)
    with pytest.raises(ValueError, match="one-block int8 kernel, not config"):
        launch_row_gemv(torch.zeros(1, 1, 256), rows, None, None, None, 1e-5, 0.0, 0,
                        config, False, torch.ones(16),
                        counts=torch.zeros(16, dtype=torch.int32), x_qblock=32)
