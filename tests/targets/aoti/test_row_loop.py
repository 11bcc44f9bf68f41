"""The row loop (kernels/row_loop_triton.py): a grid of few programs, each taking several
blocks of rows with the next block's first columns loaded ahead, computes
reference.row_gemv over every fold (norm, gated activations, residual, bias, int8 rows'
scales, rotary rows), with grids that leave a program's last turn empty or half full.
On a GPU, or on the CPU under ``TRITON_INTERPRET=1``; the dependent launch on a Hopper
GPU only."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels import reference
from tests.helpers import triton_device

pytest.importorskip("triton")


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


@pytest.mark.parametrize("config", [  # (BLOCK_N, BLOCK_K, warps, AHEAD, TILE_X, TURNS)
    (1, 64, 4, 256, False, 5), (2, 64, 4, 64, False, 3), (4, 32, 4, 32, False, 2),
    (8, 64, 4, 16, False, 1)])
@pytest.mark.parametrize("case", [  # (N, K, norm, act, residual, bias): odd sizes too
    (37, 200, True, 1, False, True), (96, 64, False, 3, True, False),
    (64, 256, True, 0, False, False)])
def test_row_loop_matches_the_reference(case, config):
    device = triton_device()
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    n, k, norm, act, res, bias = case
    generator = torch.Generator().manual_seed(n + k + config[-1])

    def made(*size, scale=1.0):
        return (torch.randn(size, generator=generator) * scale).to(device)
    weight = made(2 * n if act else n, k, scale=0.05)
    x = made(1, 1, k)
    args = (made(weight.shape[0]) if bias else None,
            (torch.rand(k, generator=generator) + 0.5).to(device) if norm else None,
            made(1, 1, n) if res else None, 1e-6, 0.0, act)
    want = reference.row_gemv(x, weight, *args)
    got = launch_row_gemv(x, weight, *args, config=config)
    assert got.shape == want.shape
    assert _error(got, want) < 1e-5


@pytest.mark.parametrize("config", [(2, 64, 4, 64, False, 3), (8, 64, 4, 256, False, 2),
                                    (4, 64, 4, 16, False, 7)])
def test_row_loop_rotates_the_first_rows_as_the_reference(config):
    """q/k/v's rotary rows: each block's pairs of rows half a head apart, every turn."""
    device = triton_device()
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    heads, kv_heads, dim, k = 4, 2, 16, 200
    generator = torch.Generator().manual_seed(config[-1])
    rotated = (heads + kv_heads) * dim
    weight = (torch.randn(rotated + kv_heads * dim, k, generator=generator) * 0.05).to(device)
    x = torch.randn(1, 1, k, generator=generator).to(device)
    angle = 9.0 / 10000 ** (torch.arange(0, dim, 2) / dim)
    cos, sin = (f(torch.cat([angle, angle])).view(1, 1, 1, dim).to(device)
                for f in (torch.cos, torch.sin))
    args = (None, (torch.rand(k, generator=generator) + 0.5).to(device), None, 1e-6, 0.0, 0)
    turn = dict(rotary_cos=cos, rotary_sin=sin, rotary_rows=rotated, head_dim=dim)
    want = reference.row_gemv(x, weight, *args, **turn)
    got = launch_row_gemv(x, weight, *args, config=config, **turn)
    assert _error(got, want) < 1e-5


def test_row_loop_over_int8_rows_applies_each_rows_scale():
    device = triton_device()
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    generator = torch.Generator().manual_seed(8)
    n, k = 40, 128
    weight = torch.randint(-127, 128, (2 * n, k), generator=generator,
                           dtype=torch.int8).to(device)
    scale = (torch.rand(2 * n, generator=generator) * 1e-3 + 1e-4).to(device)
    x = torch.randn(1, 1, k, generator=generator).to(device)
    args = (None, (torch.rand(k, generator=generator) + 0.5).to(device), None, 1e-6, 0.0, 1)
    want = reference.row_gemv(x, weight, *args, weight_scale=scale)
    got = launch_row_gemv(x, weight, *args, config=(2, 64, 4, 64, False, 4),
                          weight_scale=scale)
    assert _error(got, want) < 1e-5


def test_dependent_gated_products_of_16_bit_rows_take_the_row_loop_in_one_wave():
    """The ~1.1B's gate/up on 132 multiprocessors: two rows a block, whole rows ahead,
    five turns, so its 564 programs fit at five a multiprocessor; a plain launch, int8
    rows, longer rows, no GPU's count, a product not gated: one block a program."""
    from targets.aoti.kernels.row_loop_triton import _LOOP_PER_SM
    from targets.aoti.kernels.triton_kernels import gemv_config
    config = gemv_config(5632, 2048, True, True, 2, 132)
    assert config == (2, 512, 4, 2048, False, 5)
    assert -(-5632 // 2 // config[-1]) <= _LOOP_PER_SM * 132
    assert gemv_config(5632, 2048, True, True, 2, 114)[-1] == 5
    assert gemv_config(1024, 512, True, True, 2, 132) == (2, 512, 4, 512, False, 1)
    for other in (gemv_config(5632, 2048, True, False, 2, 132),
                  gemv_config(5632, 2048, True, True, 1, 132),
                  gemv_config(14336, 4096, True, True, 2, 132),
                  gemv_config(5632, 2048, True, True, 2),
                  gemv_config(2560, 2048, False, True, 2, 132)):
        assert len(other) == 4


@pytest.mark.cuda
@pytest.mark.parametrize("config", [None, (1, 1024, 4, 2048, False, 11),
                                    (2, 512, 4, 2048, False, 2)])
def test_row_loop_as_a_dependent_launch_waits_for_what_it_reads(config):
    """A chain of row loops, each reading the one before's output, started as
    programmatic dependent launches inside a CUDA graph: the reference's numbers (a
    program that read x before the kernel before had written it would not give them);
    None: gemv_config's choice for dependent launches (gate/up's row loop)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("dependent launches need a Hopper GPU")
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    torch.manual_seed(11)
    cuda = dict(device="cuda", dtype=torch.float16)
    hidden, inter = 2048, 5632
    ups = [torch.randn(2 * inter, hidden, **cuda) * 0.02 for _ in range(3)]
    downs = [torch.randn(hidden, inter, **cuda) * 0.02 for _ in range(3)]
    norm = torch.rand(hidden, **cuda) + 0.5
    x = torch.randn(1, 1, hidden, **cuda)

    def chain(gemv):
        h = x
        for up, down in zip(ups, downs):
            gated = gemv(h, up, None, norm, None, 1e-5, 0.0, 1)
            h = gemv(gated, down, None, None, h, 1e-5, 0.0, 0)
        return h

    want = chain(reference.row_gemv).float()
    dependent = lambda *a: launch_row_gemv(*a, config=config, pdl=True)  # noqa: E731
    chain(dependent)  # compiled before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = chain(dependent)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert _error(got, want) < 5e-3
