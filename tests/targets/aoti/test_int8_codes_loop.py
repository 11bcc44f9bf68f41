"""int8_codes_loop_triton.py: int8 rows against x's int8 codes as a row loop (x quantized
once a program, blocks of rows in turns), against reference.row_gemv(x_qblock=) over the
folds, and the same sums as the one-block kernel. Under TRITON_INTERPRET=1 on the CPU, or
on a GPU."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import triton_device

pytest.importorskip("triton")


def _made(*size, seed, scale=1.0, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(size, generator=generator) * scale).to(device, torch.float16)


@pytest.mark.parametrize("n, k, act, norm, res, config, qblock", [
    (40, 128, 1, True, False, (4, 3, 4), 32),  # gate/up: 10 blocks over 3 programs
    (36, 96, 0, True, False, (2, 4, 4), 32),  # q/k/v: 96 columns (a masked power of two)
    (41, 64, 0, False, True, (8, 2, 2), 16),  # a residual, a part block, 3 turns
    (24, 256, 1, True, True, (16, 1, 8), 128),  # one program takes every block
])
def test_row_loops_over_x_codes_are_row_gemvs_of_the_quantized_x(n, k, act, norm, res,
                                                                 config, qblock):
    device = triton_device()
    from targets.aoti.kernels.int8_codes_loop_triton import launch_int8_codes_loop
    from targets.aoti.kernels.int8_words_triton import launch_int8_words
    from targets.aoti.kernels.reference import row_gemv
    rows = 2 * n if act else n
    generator = torch.Generator().manual_seed(6)
    weight = torch.randint(-127, 128, (rows, k), generator=generator, dtype=torch.int8)
    scale = (torch.rand(rows, generator=generator) * 2e-2 + 1e-2).half()
    weight, scale = weight.to(device), scale.to(device)
    x = _made(1, 1, k, seed=1, device=device)
    nw = _made(k, seed=2, scale=0.1, device=device) + 1.0 if norm else None
    r = _made(1, 1, n, seed=3, device=device) if res else None
    got = launch_int8_codes_loop(x, weight, None, nw, r, 1e-5, 0.0, act, scale, qblock,
                                 config).float()
    want = row_gemv(x, weight, None, nw, r, 1e-5, 0.0, act, scale, x_qblock=qblock).float()
    assert (got - want).abs().max().item() <= 2e-3 * max(1.0, want.abs().max().item())
    one_block = launch_int8_words(x, weight, None, nw, r, 1e-5, 0.0, act, scale,
                                  (4, qblock, 4, 0), x_qblock=qblock).float()
    assert (got - one_block).abs().max().item() <= 1e-3 * max(1.0, want.abs().max().item())


def test_rows_that_do_not_fit_are_refused():
    from targets.aoti.kernels.int8_codes_loop_triton import (codes_loop_fits,
                                                             launch_int8_codes_loop)
    assert codes_loop_fits(torch.zeros(8, 2048, dtype=torch.int8), 8, 32)
    assert not codes_loop_fits(torch.zeros(8, 8192, dtype=torch.int8), 8, 32)  # too long
    assert not codes_loop_fits(torch.zeros(8, 96, dtype=torch.int8), 8, 64)  # part block
    assert not codes_loop_fits(torch.zeros(8, 96, dtype=torch.float16), 8, 32)
    with pytest.raises(ValueError, match="whole blocks of 64"):
        launch_int8_codes_loop(torch.zeros(1, 1, 96), torch.zeros(8, 96, dtype=torch.int8),
                               None, None, None, 1e-6, 0.0, 0, torch.ones(8), 64, (4, 2, 4))
