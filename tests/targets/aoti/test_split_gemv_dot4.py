"""split_gemv_triton.py against x's int8 codes (``x_qblock``; int8_dot4_triton.py's
pieces): int8 rows split along K, each part quantizing its own columns of x in blocks,
four products a dp4a, against reference.row_gemv(x_qblock=); launch_row_gemv's split
route passes x_qblock through. Under TRITON_INTERPRET=1 on the CPU (dp4a as byte
products), or on a GPU (the PTX)."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels import reference
from tests.helpers import triton_device
from tests.targets.aoti.test_int8_dot4 import exact_codes

pytest.importorskip("triton")

# (BLOCK_N, BLOCK_K, warps, AHEAD, SPLIT) over 384 columns: parts of 384 (the library's
# split_config), 128 (a loop after the held tile), 64, 192 (its last tile half masked),
# and a held tile wider than its part of 128
CONFIGS = [None, (4, 32, 4, 64, 3), (16, 64, 8, 64, 6), (2, 128, 4, 128, 2),
           (8, 64, 4, 256, 3)]


def _launch(x, weight, scale, config, qblock, residual=None, bias=None, counts=None):
    from targets.aoti.kernels.split_gemv_triton import launch_split_gemv, split_counters
    counts = split_counters(weight, config) if counts is None else counts
    out = launch_split_gemv(x, weight, bias, residual, counts, config, False, scale,
                            x_qblock=qblock)
    assert not counts.any()  # the last part of each block set its counter back
    return out


@pytest.mark.parametrize("config", CONFIGS)
def test_codes_that_are_exact_give_exact_integer_sums(config):
    """x of integers with 127 or -127 in every block of 32: each code is x itself and each
    scale 1, so every part's sum and their join are exact integers; a byte lost, moved,
    read with the wrong sign, or a column summed in two parts (or none) differs."""
    device = triton_device()
    weight, x, want = exact_codes(384)
    got = _launch(x.reshape(1, 1, 384).to(device), weight.to(device),
                  torch.ones(24, device=device), config, 32)
    assert torch.equal(got.double().reshape(-1).cpu(), want)


@pytest.mark.parametrize("config, qblock, bias, res", [
    (None, 32, False, True),  # the library's split, down's fold: a residual
    ((4, 32, 4, 64, 3), 32, True, True),
    ((16, 64, 8, 64, 6), 64, False, False),
    ((2, 128, 4, 128, 2), 64, True, False),  # 192-column parts: blocks of 64 fit
    ((8, 64, 4, 256, 3), 16, False, True),
])
def test_split_products_over_x_codes_are_row_gemvs_of_the_quantized_x(config, qblock,
                                                                      bias, res):
    """fp16 x, int8 rows with their scales: reference.row_gemv over x quantized as it
    says (tight), and within int8 activations' error of the float product (loose)."""
    device = triton_device()
    generator = torch.Generator().manual_seed(11)
    n, k = 40, 384
    weight = torch.randint(-127, 128, (n, k), generator=generator, dtype=torch.int8)
    scale = (torch.rand(n, generator=generator) * 2e-2 + 1e-2).half()
    x = torch.randn(1, 1, k, generator=generator).half()
    b = torch.randn(n, generator=generator).half() if bias else None
    r = torch.randn(1, 1, n, generator=generator).half() if res else None
    weight, scale, x = weight.to(device), scale.to(device), x.to(device)
    b, r = (t if t is None else t.to(device) for t in (b, r))
    got = _launch(x, weight, scale, config, qblock, r, b).float()
    quantized = reference.row_gemv(x, weight, b, None, r, 1e-5, 0.0, 0, scale,
                                   x_qblock=qblock).float()
    exact = reference.row_gemv(x, weight, b, None, r, 1e-5, 0.0, 0, scale).float()
    top = max(1.0, exact.abs().max().item())
    assert (got - quantized).abs().max().item() <= 2e-3 * top
    assert not torch.equal(quantized, exact)  # the codes are not x itself
    assert ((got - exact).norm() / exact.norm()).item() < 2e-2


def test_every_split_computes_the_same_codes():
    """x's blocks are the kernel's, not a part's or a tile's: the sums agree across
    splits and shapes (to fp32 summation order), as they would not if a part chose its
    own scale; the one-block kernel (int8_words_triton.py) agrees too."""
    device = triton_device()
    from targets.aoti.kernels.int8_words_triton import launch_int8_words
    generator = torch.Generator().manual_seed(2)
    weight = torch.randint(-127, 128, (32, 512), generator=generator, dtype=torch.int8)
    weight, scale = weight.to(device), torch.full((32,), 1e-2, device=device)
    x = torch.randn(1, 1, 512, generator=generator).half().to(device)
    x[..., 200] = 40.0  # one outlier: its block's scale alone grows
    runs = [_launch(x, weight, scale, config, 32).float()
            for config in [(8, 512, 4, 512, 1), (4, 64, 4, 128, 4), (8, 32, 4, 32, 16),
                           (2, 128, 4, 256, 2)]]
    runs.append(launch_int8_words(x, weight, None, None, None, 1e-6, 0.0, 0, scale,
                                  (4, 128, 4, 0), x_qblock=32).float())
    for run in runs[1:]:
        assert (run - runs[0]).abs().max().item() <= 1e-3 * runs[0].abs().max().item()


def test_the_row_gemv_route_passes_x_qblock_to_the_split_kernel():
    """launch_row_gemv with a split configuration (its 7-tuple) and x_qblock: the split
    kernel over x's codes, counters left at zero; a row loop's configuration is refused."""
    device = triton_device()
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    generator = torch.Generator().manual_seed(4)
    weight = torch.randint(-127, 128, (16, 256), generator=generator, dtype=torch.int8)
    scale = torch.full((16,), 1e-2, device=device)
    weight = weight.to(device)
    x = torch.randn(1, 1, 256, generator=generator).half().to(device)
    r = torch.randn(1, 1, 16, generator=generator).half().to(device)
    counts = torch.zeros(16, dtype=torch.int32, device=device)
    got = launch_row_gemv(x, weight, None, None, r, 1e-5, 0.0, 0, (8, 64, 4, 64, False, 0, 4),
                          False, scale, counts=counts, x_qblock=32)
    want = reference.row_gemv(x, weight, None, None, r, 1e-5, 0.0, 0, scale, x_qblock=32)
    assert (got.float() - want.float()).abs().max().item() <= 2e-3 * want.abs().max().item()
    assert not counts.any()
    with pytest.raises(ValueError, match="one-block int8 kernel or the split one"):
        launch_row_gemv(x, weight, None, None, r, 1e-5, 0.0, 0, (4, 64, 4, 64, False, 2),
                        False, scale, x_qblock=32)


@pytest.mark.parametrize("qblock, config, why", [
    (64, (4, 32, 4, 64, 3), "BLOCK_K of half a block"),
    (32, (4, 32, 4, 16, 3), "columns ahead of half a block"),
    (128, (4, 128, 4, 128, 2), "parts of 192 columns: not whole blocks"),
    (24, (4, 96, 4, 96, 4), "not a power of two"),
    (8, (4, 32, 4, 32, 3), "blocks under 16 columns"),
])
def test_blocks_that_do_not_fit_are_refused(qblock, config, why):
    from targets.aoti.kernels.split_gemv_triton import codes_fit, launch_split_gemv
    rows = torch.zeros(8, 384, dtype=torch.int8)
    assert codes_fit(rows, (4, 32, 4, 64, 3), 32)
    assert not codes_fit(rows, config, qblock), why
    with pytest.raises(ValueError, match=f"x's int8 codes in blocks of {qblock} need"):
        launch_split_gemv(torch.zeros(1, 1, 384), rows, None, None,
                          torch.zeros(2, dtype=torch.int32), config, x_qblock=qblock)


def test_float_rows_are_refused():
    from targets.aoti.kernels.split_gemv_triton import launch_split_gemv
    with pytest.raises(ValueError, match="need int8 rows"):
        launch_split_gemv(torch.zeros(1, 1, 384), torch.zeros(8, 384), None, None,
                          torch.zeros(2, dtype=torch.int32), (4, 32, 4, 64, 3), x_qblock=32)
