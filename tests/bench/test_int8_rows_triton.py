"""The int8-row kernel kept as a timing tool (bench/int8_rows_triton.py) against the
reference math: every byte value read exactly, every fold, the rotary rows. On a GPU, or
on the CPU under ``TRITON_INTERPRET=1``."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels import reference
from tests.helpers import triton_device

pytest.importorskip("triton")


def _rows(rows, k, device, seed):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randint(-128, 128, (rows, k), generator=generator, dtype=torch.int8)
    scale = torch.rand(rows, generator=generator) * 1e-3 + 1e-4
    return weight.to(device), scale.to(device=device, dtype=torch.float16)


@pytest.mark.cuda
@pytest.mark.parametrize("config", [None, (2, 16, 4), (8, 32, 4), (4, 128, 8)])
def test_int8_row_gemv_kernel_reads_every_byte_value_exactly(config):
    """Each row holds every byte value -128..127 once, in its own order, x small integers
    that differ by a word's byte, scale 1, in float32: every sum is an exact integer, so
    a byte lost, moved or read with the wrong sign shows as a mismatch."""
    device = triton_device()
    from bench.int8_rows_triton import launch_int8_row_gemv
    cols = torch.arange(256, device=device)
    weight = ((torch.arange(256, device=device)[:, None] + 37 * cols) % 256 - 128)
    weight = weight.to(torch.int8)
    scale = torch.ones(256, device=device)
    x = (1 + cols % 4 + 4 * (cols >= 128)).float().reshape(1, 1, 256)
    got = launch_int8_row_gemv(x, weight, scale, None, None, None, 1e-6, 0.0, 0,
                               config=config)
    want = weight.double() @ x.double().reshape(-1)
    assert got.dtype == torch.float32
    assert torch.equal(got.double().reshape(-1), want)


@pytest.mark.cuda
@pytest.mark.parametrize("config", [None, (2, 16, 4), (8, 64, 4)])
@pytest.mark.parametrize("case", [  # (N, K, norm, act, residual, bias): odd sizes too
    (37, 200, True, 1, False, True), (96, 64, False, 0, True, False),
    (64, 1100, True, 1, True, False), (40, 2048, False, 0, True, True)])
def test_int8_row_gemv_kernel_matches_its_reference(case, config):
    """fp16 x against int8 rows, each row's scale applied to its sum: odd row counts, a
    width no block divides, the norm (the -128's sum of x taken after the norm's
    weights), gated SiLU x up, bias and residual."""
    device = triton_device()
    from bench.int8_rows_triton import launch_int8_row_gemv
    n, k, norm, act, res, bias = case
    dtype = dict(device=device, dtype=torch.float16)
    rows = 2 * n if act else n
    weight, scale = _rows(rows, k, device, n + k)
    torch.manual_seed(n * k)
    x = torch.randn(1, 1, k, **dtype) + 0.5  # a sum of x far from 0: the -128 matters
    args = (torch.randn(rows, **dtype) if bias else None,
            torch.rand(k, **dtype) + 0.5 if norm else None,
            torch.randn(1, 1, n, **dtype) if res else None, 1e-6, 0.0, act)
    want = reference.row_gemv(x, weight, *args, weight_scale=scale).float()
    got = launch_int8_row_gemv(x, weight, scale, *args, config=config)
    assert got.dtype == torch.float16 and got.shape == want.shape
    assert ((got.float() - want).norm() / want.norm()).item() < 2e-3


@pytest.mark.cuda
@pytest.mark.parametrize("config", [None, (4, 16, 4)])
def test_int8_row_gemv_kernel_rotates_the_first_rows_as_its_reference(config):
    device = triton_device()
    from bench.int8_rows_triton import launch_int8_row_gemv
    heads, kv_heads, dim, k = 8, 2, 64, 256
    dtype = dict(device=device, dtype=torch.float16)
    rotated = (heads + kv_heads) * dim
    weight, scale = _rows(rotated + kv_heads * dim, k, device, dim)
    torch.manual_seed(dim)
    x = torch.randn(1, 1, k, **dtype)
    angle = 9.0 / 10000 ** (torch.arange(0, dim, 2, device=device) / dim)
    cos, sin = (f(torch.cat([angle, angle])).half().view(1, 1, 1, dim)
                for f in (torch.cos, torch.sin))
    args = (None, torch.rand(k, **dtype) + 0.5, None, 1e-6, 0.0, 0)
    turn = dict(rotary_cos=cos, rotary_sin=sin, rotary_rows=rotated, head_dim=dim)
    want = reference.row_gemv(x, weight, *args, weight_scale=scale, **turn).float()
    assert not torch.allclose(want, reference.row_gemv(x, weight, *args,
                                                       weight_scale=scale).float())
    got = launch_int8_row_gemv(x, weight, scale, *args, config=config, **turn).float()
    assert ((got - want).norm() / want.norm()).item() < 2e-3
