"""The pipelined row gemv (bench/decode_pipe_gemv.py) computes reference.row_gemv's
math: the residual, the norm, rotary rows, rows and columns that do not fill a block or
a tile, programs of one turn or several (the last turn partly past the rows). Under
``TRITON_INTERPRET=1`` on the CPU, or on a GPU."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import triton_device

pytest.importorskip("triton")


def _made(*size, seed, scale=1.0, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(size, generator=generator) * scale).to(device, torch.float16)


def _close(got, want):
    error = (got.float() - want.float()).abs().max().item()
    assert error <= 2e-2 * max(1.0, want.float().abs().max().item()), error


@pytest.mark.parametrize("rows,cols,config", [
    (64, 256, (4, 64, 4, 64, 3, 1)),     # whole blocks and tiles
    (38, 200, (4, 64, 4, 64, 3, 1)),     # masked rows and columns
    (38, 200, (4, 32, 4, 128, 4, 2)),    # two turns, the last partly past the rows
    (50, 130, (8, 32, 4, 32, 2, 3)),     # three turns, one column past four tiles
])
def test_the_residual_product_is_row_gemv(rows, cols, config):
    device = triton_device()
    from bench.decode_pipe_gemv import launch_pipe_gemv
    from targets.aoti.kernels.reference import row_gemv
    x = _made(1, 1, cols, seed=1, device=device)
    weight = _made(rows, cols, seed=2, scale=0.1, device=device)
    residual = _made(1, 1, rows, seed=3, device=device)
    got = launch_pipe_gemv(x, weight, None, residual, config)
    assert got.shape == (1, 1, rows) and got.dtype == torch.float16
    _close(got, row_gemv(x, weight, None, None, residual, 1e-5, 0.0, 0))


@pytest.mark.parametrize("config", [(4, 32, 4, 32, 3, 1), (4, 32, 4, 64, 4, 2)])
def test_the_norm_and_rotary_rows_are_row_gemv(config):
    """q/k/v's folds: RMSNorm of x (its squares over every column, the first ones held
    ahead too) and the rotary embedding of the first rows, heads of 16."""
    device = triton_device()
    from bench.decode_pipe_gemv import launch_pipe_gemv
    from targets.aoti.kernels.reference import row_gemv
    rows, cols, rotary, head = 72, 160, 48, 16
    x = _made(1, 1, cols, seed=4, scale=3.0, device=device)
    weight = _made(rows, cols, seed=5, scale=0.1, device=device)
    norm = _made(cols, seed=6, scale=0.1, device=device) + 1.0
    cos, sin = _made(head, seed=7, device=device), _made(head, seed=8, device=device)
    got = launch_pipe_gemv(x, weight, norm, None, config, eps=1e-5, offset=0.5,
                           rotary_cos=cos, rotary_sin=sin, rotary_rows=rotary,
                           head_dim=head)
    _close(got, row_gemv(x, weight, None, norm, None, 1e-5, 0.5, 0, None, cos, sin, rotary,
                         head))


def test_a_chain_launch_takes_the_chains_folds():
    """PipeLaunch as decode_chain_cuda.step calls it: ``fold`` holds the norm or the
    residual."""
    device = triton_device()
    from bench.decode_pipe_gemv import PipeLaunch
    from targets.aoti.kernels.reference import row_gemv
    x = _made(1, 1, 96, seed=9, device=device)
    weight = _made(40, 96, seed=10, scale=0.1, device=device)
    norm = _made(96, seed=11, scale=0.1, device=device) + 1.0
    launch = PipeLaunch((2, 32, 4, 32, 3, 2))
    _close(launch(x, weight, None, {"norm": norm}, False),
           row_gemv(x, weight, None, norm, None, 1e-5, 0.0, 0))
    _close(launch(x, weight, None, {"residual": x[..., :40]}, False),
           row_gemv(x, weight, None, None, x[..., :40], 1e-5, 0.0, 0))
    assert repr(launch) == "pipe(2, 32, 4, 32, 3, 2)"


def test_a_config_the_kernel_cannot_compute_is_refused():
    from bench.decode_pipe_gemv import PipeLaunch, check_config
    for bad in [(4, 64, 4, 96, 3, 1),     # AHEAD not a multiple of BLOCK_K
                (4, 64, 4, 256, 3, 1),    # AHEAD the whole row: nothing left to stream
                (4, 64, 4, 0, 3, 1), (4, 64, 4, 64, 3, 0)]:
        with pytest.raises(ValueError, match="pipe config"):
            check_config(bad, 256)
    with pytest.raises(ValueError, match="no gate"):
        PipeLaunch((4, 64, 4, 64, 3, 1))(None, None, None, {"act": 1}, False)
    with pytest.raises(ValueError, match="16-bit rows"):
        PipeLaunch((4, 64, 4, 64, 3, 1))(None, None, object(), {}, False)


def test_the_variants_change_only_their_product_and_fit_the_1b_shapes():
    from bench.decode_pipe_gemv import CHANGES, SHAPES, PipeLaunch, check_config, pipe_variants
    default = {"qkv": (4, 512, 4, 2048), "o": (2, 512, 4, 2048),
               "gate_up": (2, 512, 4, 2048, False, 5), "down": (4, 512, 4, 2048)}
    found = pipe_variants(default)
    assert len(found) == len(CHANGES)
    pdl, configs, cache_ahead, join = found["dependent + join + pipe down 4 rows 4 stages"]
    assert pdl and join and cache_ahead is None
    assert isinstance(configs["down"], PipeLaunch)
    assert {k: v for k, v in configs.items() if k != "down"} == {
        k: v for k, v in default.items() if k != "down"}
    for changes in CHANGES.values():
        for product, config in changes.items():
            check_config(config, SHAPES[product][1])


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["pipe down 4 rows 4 stages", "pipe down 4 rows 2 turns 6 stages",
                                  "pipe down 4 rows 1024-column tiles 2 turns 4 stages"])
def test_dependent_launches_at_the_1b_shapes_replay_in_a_cuda_graph(name):
    """q/k/v-shaped (norm) then down-shaped (residual) dependent launches, the second
    reading what the first wrote, captured and replayed: row_gemv's result each replay
    (a copy issued before the wait would read x before it is written)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a Hopper GPU")
    from bench.decode_pipe_gemv import CHANGES, launch_pipe_gemv
    from targets.aoti.kernels.reference import row_gemv
    h = _made(1, 1, 2048, seed=12, device="cuda")
    up = _made(5632, 2048, seed=13, scale=0.02, device="cuda")
    down = _made(2048, 5632, seed=14, scale=0.02, device="cuda")
    norm = _made(2048, seed=15, scale=0.1, device="cuda") + 1.0
    gated = row_gemv(h, up, None, norm, None, 1e-5, 0.0, 0)
    want = row_gemv(gated, down, None, None, h, 1e-5, 0.0, 0).float()
    config = CHANGES[name]["down"]

    def both():
        x = launch_pipe_gemv(h, up, norm, None, (4, 512, 4, 1024, 3, 1), pdl=True)
        return launch_pipe_gemv(x, down, None, h, config, pdl=True)
    both()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = both()
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert (out.float() - want).abs().max().item() < 2e-2 * want.abs().max().item()
