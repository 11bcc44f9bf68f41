"""A layer's MLP half in one persistent kernel (bench/persistent_mlp.py): three
row_gemv calls' reference math, and the barrier buffer left fit for the next call. On
the CPU under ``TRITON_INTERPRET=1`` one program does every block (the interpreter runs
programs one after the other, so a grid-wide barrier over several would never open); on
a GPU the grid is every multiprocessor's programs."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels import reference
from tests.helpers import triton_device

pytest.importorskip("triton")


def _layer(hidden, inter, device, seed):
    generator = torch.Generator().manual_seed(seed)

    def made(*size, scale=1.0, shift=0.0):
        return (torch.randn(size, generator=generator) * scale + shift).to(
            device=device, dtype=torch.float16)
    return dict(attn=made(1, 1, hidden), hidden=made(1, 1, hidden),
                o_weight=made(hidden, hidden, scale=hidden ** -0.5),
                norm_weight=made(hidden, scale=0.1, shift=1.0),
                gate_up_weight=made(2 * inter, hidden, scale=hidden ** -0.5),
                down_weight=made(hidden, inter, scale=inter ** -0.5))


def _expected(layer, eps):
    o = reference.row_gemv(layer["attn"], layer["o_weight"], None, None, layer["hidden"],
                           eps, 0.0, 0)
    gated = reference.row_gemv(o, layer["gate_up_weight"], None, layer["norm_weight"],
                               None, eps, 0.0, 1)
    out = reference.row_gemv(gated, layer["down_weight"], None, None, o, eps, 0.0, 0)
    return o, out


CONFIGS = {  # (programs a multiprocessor, warps, (BLOCK_N, BLOCK_K, AHEAD) each product)
    "default": None,
    "whole rows ahead": (1, 4, (4, 64, 128), (2, 64, 128), (4, 64, 256)),
    "narrow blocks": (2, 4, (2, 32, 16), (4, 32, 32), (2, 16, 16)),
}


@pytest.mark.parametrize("sizes,config", [  # 352, 96: not powers of two
    ((128, 352), "default"), ((64, 96), "whole rows ahead"), ((64, 96), "narrow blocks")])
def test_persistent_mlp_matches_three_row_gemvs_and_counts_every_program_in(sizes, config):
    from bench.persistent_mlp import (DEFAULT_CONFIG, launch_persistent_mlp,
                                                     persistent_grid)
    device = triton_device()
    sync = torch.zeros(2, device=device, dtype=torch.int32)
    for seed in (0, 1):  # one buffer for two calls, as the step's layers share it
        layer = _layer(*sizes, device, seed)
        o, out = launch_persistent_mlp(**layer, sync=sync, eps=1e-5,
                                       config=CONFIGS[config])
        want_o, want_out = _expected(layer, 1e-5)
        assert o.shape == want_o.shape and out.shape == want_out.shape
        assert (o.float() - want_o.float()).abs().max().item() < 4e-3
        assert (out.float() - want_out.float()).abs().max().item() < 8e-3
        # every program counted in at two barriers a call
        assert sync[0].item() == 2 * (seed + 1) * persistent_grid(
            torch.device(device), (CONFIGS[config] or DEFAULT_CONFIG)[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the grid barrier needs a GPU")
def test_persistent_mlp_on_the_gpu_agrees_with_its_dependent_launch_many_times():
    """Every multiprocessor's programs through both barriers, 50 calls in a row on one
    buffer: the same bits each call, plain and dependent launch."""
    from bench.persistent_mlp import (DEFAULT_CONFIG, launch_persistent_mlp,
                                                     persistent_grid)
    layer = _layer(2048, 5632, "cuda", 0)
    sync = torch.zeros(2, device="cuda", dtype=torch.int32)
    first = launch_persistent_mlp(**layer, sync=sync, eps=1e-5)[1]
    pdl = torch.cuda.get_device_capability()[0] >= 9
    for _ in range(50):
        again = launch_persistent_mlp(**layer, sync=sync, eps=1e-5, pdl=pdl)[1]
        assert torch.equal(again, first)
    want = _expected(layer, 1e-5)[1]
    assert (first.float() - want.float()).abs().max().item() < 2e-2
    grid = persistent_grid(torch.device("cuda"), DEFAULT_CONFIG[0])
    assert sync[0].item() == 51 * 2 * grid

