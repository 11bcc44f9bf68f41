"""The pipelined row gemv (kernels/pipe_gemv_triton.py) computes reference.row_gemv's
math: the residual, the norm, rotary rows, rows and columns that do not fill a block or
a tile, programs of one turn or several (the last turn partly past the rows); and
launch_row_gemv starts it where gemv_config says, for products it can compute. Under
``TRITON_INTERPRET=1`` on the CPU, or on a GPU (the dependent launches in a CUDA graph on
a Hopper GPU only)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import triton_device
from tests.targets.aoti.aoti_library import compile_library

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
    from targets.aoti.kernels.pipe_gemv_triton import launch_pipe_gemv
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
    from targets.aoti.kernels.pipe_gemv_triton import launch_pipe_gemv
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


def test_a_config_the_kernel_cannot_compute_is_refused():
    from targets.aoti.kernels.pipe_gemv_triton import check_config
    for bad in [(4, 64, 4, 96, 3, 1),     # AHEAD not a multiple of BLOCK_K
                (4, 64, 4, 256, 3, 1),    # AHEAD the whole row: nothing left to stream
                (4, 64, 4, 0, 3, 1), (4, 64, 4, 64, 3, 0)]:
        with pytest.raises(ValueError, match="pipe config"):
            check_config(bad, 256)


@pytest.mark.parametrize("folds", ["residual", "bias", "norm"])
def test_launch_row_gemv_pipelines_where_its_config_says_and_the_product_allows(
        folds, monkeypatch):
    """A config with STAGES (gemv_config's 8-tuple): a product with a residual only runs
    the pipelined kernel; one with a bias or a norm, which it does not fold, runs the
    one-block kernel on the config's first fields. Both give row_gemv's result."""
    device = triton_device()
    from targets.aoti.kernels import triton_kernels
    from targets.aoti.kernels.reference import row_gemv
    started = []
    real = triton_kernels.launch_pipe_gemv
    monkeypatch.setattr(triton_kernels, "launch_pipe_gemv",
                        lambda *a, **k: started.append(a[4]) or real(*a, **k))
    rows, cols = 40, 320
    x = _made(1, 1, cols, seed=21, device=device)
    weight = _made(rows, cols, seed=22, scale=0.1, device=device)
    residual = _made(1, 1, rows, seed=23, device=device)
    bias = _made(rows, seed=24, device=device) if folds == "bias" else None
    norm = _made(cols, seed=25, scale=0.1, device=device) + 1.0 if folds == "norm" else None
    config = (4, 64, 4, 64, False, 0, 0, 3)
    got = triton_kernels.launch_row_gemv(x, weight, bias, norm, residual, 1e-5, 0.0, 0,
                                         config)
    _close(got, row_gemv(x, weight, bias, norm, residual, 1e-5, 0.0, 0))
    assert started == ([(4, 64, 4, 64, 3, 1)] if folds == "residual" else [])


def test_dependent_launches_of_rows_far_longer_than_held_ahead_are_pipelined():
    """The ~1.1B's fp16 down (2,048 x 5,632; 2,048 columns held ahead) as a dependent
    launch with nothing but a residual: 4 stages; a plain launch, int8 rows, a norm or
    bias (not streamable), o's rows (held whole ahead) and the head keep the one-block
    kernel."""
    from targets.aoti.kernels.triton_kernels import gemv_config
    down = gemv_config(2048, 5632, False, True, 2, 132, False, True)
    assert down == (4, 512, 4, 2048, False, 0, 0, 4)
    for other in (gemv_config(2048, 5632, False, False, 2, 132, False, True),
                  gemv_config(2048, 5632, False, True, 2, 132),
                  gemv_config(2048, 2048, False, True, 2, 132, False, True),
                  gemv_config(32000, 2048, False, True, 2, 132)):
        assert len(other) == 4
    assert len(gemv_config(2048, 5632, False, True, 1, 132, True, True)) == 7  # split


@pytest.mark.cuda
@pytest.mark.parametrize("config", [(4, 512, 4, 2048, 4, 1), (4, 512, 4, 2048, 6, 2),
                                    (4, 1024, 4, 2048, 4, 2)])
def test_dependent_launches_at_the_1b_shapes_replay_in_a_cuda_graph(config):
    """q/k/v-shaped (norm) then down-shaped (residual) dependent launches, the second
    reading what the first wrote, captured and replayed: row_gemv's result each replay
    (a copy issued before the wait would read x before it is written)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a Hopper GPU")
    from targets.aoti.kernels.pipe_gemv_triton import launch_pipe_gemv
    from targets.aoti.kernels.reference import row_gemv
    h = _made(1, 1, 2048, seed=12, device="cuda")
    up = _made(5632, 2048, seed=13, scale=0.02, device="cuda")
    down = _made(2048, 5632, seed=14, scale=0.02, device="cuda")
    norm = _made(2048, seed=15, scale=0.1, device="cuda") + 1.0
    gated = row_gemv(h, up, None, norm, None, 1e-5, 0.0, 0)
    want = row_gemv(gated, down, None, None, h, 1e-5, 0.0, 0).float()

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


@pytest.mark.cuda
def test_a_library_pipelines_a_long_fp16_product_and_computes_it(tmp_path):
    """A down-shaped fp16 product with a residual, compiled by AOTInductor inside
    dependent_launches(): the library loads the pipelined kernel's ``_gdc`` form and
    nothing else. Numbers: the kernel's tests above and the 1.1B build's validation (on
    the GPU machine, whose default compiler links libstdc++ statically, torch's own
    loader crashed on such a package; the cuda target's toolchain handles that)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("dependent launches need a Hopper GPU")
    import re

    from targets.aoti.kernels import dependent_launch, ops
    hidden, inter = 2048, 5632

    class Down(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("weight", _made(hidden, inter, seed=31, scale=0.02,
                                                 device="cuda"))

        def forward(self, x, residual):
            return ops.row_gemv(x, self.weight, None, None, residual, 1e-5, 0.0, 0)

    module = Down().eval()
    inputs = (_made(1, 1, inter, seed=32, device="cuda"),
              _made(1, 1, hidden, seed=33, device="cuda"))
    program = torch.export.export(module, inputs)
    with dependent_launch.dependent_launches() as dependent:
        assert dependent
        path, source = compile_library(program, tmp_path / "d.pt2")
    loaded = set(re.findall(r'loadKernel\(\s*(?:"[^"]*"|\w+)\s*,\s*"(\w+)"', source))
    assert loaded == {"pipe_gemv_kernel_gdc"}
