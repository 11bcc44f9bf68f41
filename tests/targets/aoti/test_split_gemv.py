"""row_gemv split along K (kernels/split_gemv_triton.py) against reference.row_gemv:
exactly where every sum is exact, within float rounding otherwise, int8 rows' scales,
the block counters left at zero over many calls on one buffer, and launch_row_gemv's
dispatch to it. On a GPU, or on the CPU under ``TRITON_INTERPRET=1`` (the ``_gdc`` form
and a built library on a Hopper GPU only)."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels import reference
from tests.helpers import triton_device
from tests.targets.aoti.aoti_library import compile_library

pytest.importorskip("triton")

CONFIGS = [  # (BLOCK_N, BLOCK_K, warps, AHEAD, SPLIT): a part's rest in a loop or none
    None, (4, 32, 4, 64, 2), (2, 16, 4, 32, 4), (8, 64, 4, 256, 4), (1, 16, 2, 16, 3)]


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


@pytest.mark.parametrize("config", CONFIGS)
def test_split_gemv_equals_the_reference_where_every_sum_is_exact(config):
    """Small integers as weights and x (float32 x): each part's sum and their join are
    exact, so any column summed twice, lost, or a part joined twice shows."""
    device = triton_device()
    from targets.aoti.kernels.split_gemv_triton import launch_split_gemv, split_counters
    generator = torch.Generator().manual_seed(3)
    n, k = 37, 203  # no block or split divides them
    weight = torch.randint(-8, 9, (n, k), generator=generator).to(device, torch.float16)
    x = torch.randint(-4, 5, (1, 1, k), generator=generator).float().to(device)
    residual = torch.randint(-99, 100, (1, 1, n), generator=generator).float().to(device)
    counts = split_counters(weight, config)
    got = launch_split_gemv(x, weight, None, residual, counts, config=config)
    want = reference.row_gemv(x, weight, None, None, residual, 1e-6, 0.0, 0)
    assert got.dtype == torch.float32 and got.shape == want.shape == (1, 1, n)
    assert torch.equal(got, want)
    assert not counts.any()


@pytest.mark.parametrize("config", CONFIGS)
def test_split_gemv_leaves_its_counters_at_zero_call_after_call(config):
    """One buffer of counters over several calls and two products (as the step's layers
    share it), fp16, with and without bias and residual: each call the reference's
    numbers, and every counter back at zero after it."""
    device = triton_device()
    from targets.aoti.kernels.split_gemv_triton import launch_split_gemv, split_counters
    generator = torch.Generator().manual_seed(5)

    def made(*size, scale=1.0):
        return (torch.randn(size, generator=generator) * scale).to(device, torch.float16)
    counts = split_counters(made(96, 1), config)  # the larger product's blocks
    for call, (n, k, bias, res) in enumerate([(96, 300, False, True), (40, 128, True, True),
                                              (96, 300, True, False), (40, 128, False, False)]):
        weight, x = made(n, k, scale=k ** -0.5), made(1, 1, k)
        args = (made(n) if bias else None, made(1, 1, n) if res else None)
        got = launch_split_gemv(x, weight, *args, counts, config=config)
        want = reference.row_gemv(x, weight, args[0], None, args[1], 1e-6, 0.0, 0)
        assert got.dtype == torch.float16, call
        assert _error(got, want) < 1e-3, call
        assert not counts.any(), call


@pytest.mark.parametrize("config", [None, (4, 32, 4, 64, 2), (2, 64, 4, 128, 4)])
def test_split_gemv_over_int8_rows_applies_each_rows_scale_once(config):
    """int8 rows: the scale applied to the joined sum (once, not once a part)."""
    device = triton_device()
    from targets.aoti.kernels.split_gemv_triton import launch_split_gemv, split_counters
    generator = torch.Generator().manual_seed(8)
    n, k = 40, 352
    weight = torch.randint(-127, 128, (n, k), generator=generator, dtype=torch.int8)
    scale = torch.rand(n, generator=generator) * 1e-3 + 1e-4
    x = torch.randn(1, 1, k, generator=generator)
    residual = torch.randn(1, 1, n, generator=generator)
    weight, scale, x, residual = (t.to(device) for t in (weight, scale, x, residual))
    counts = split_counters(weight, config)
    got = launch_split_gemv(x, weight, None, residual, counts, config=config,
                            weight_scale=scale)
    want = reference.row_gemv(x, weight, None, None, residual, 1e-6, 0.0, 0,
                              weight_scale=scale)
    assert _error(got, want) < 1e-5
    assert not counts.any()


def test_split_gemv_refuses_a_counter_buffer_too_small_for_its_blocks():
    device = triton_device()
    from targets.aoti.kernels.split_gemv_triton import launch_split_gemv
    weight = torch.zeros(64, 32, device=device)
    x = torch.zeros(1, 1, 32, device=device)
    with pytest.raises(ValueError, match="16 int32 zeros"):
        launch_split_gemv(x, weight, None, None, torch.zeros(8, dtype=torch.int32,
                                                             device=device),
                          config=(4, 16, 4, 16, 2))


def test_launch_row_gemv_splits_along_k_where_its_config_says_and_counters_are_given():
    """launch_row_gemv with a config of SPLIT parts (gemv_config's 7-tuple) runs the
    split kernel over int8 rows (their scales, bias, residual), the counters left at
    zero; without counters such a config is refused."""
    device = triton_device()
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    generator = torch.Generator().manual_seed(4)
    n, k = 36, 300
    weight = torch.randint(-127, 128, (n, k), generator=generator, dtype=torch.int8)
    scale = torch.rand(n, generator=generator) * 1e-3 + 1e-4
    x, bias, residual = (torch.randn(*size, generator=generator)
                         for size in ((1, 1, k), (n,), (1, 1, n)))
    weight, scale, x, bias, residual = (t.to(device) for t in
                                        (weight, scale, x, bias, residual))
    counts = torch.zeros(n, dtype=torch.int32, device=device)
    config = (4, 64, 4, 64, False, 0, 3)
    got = launch_row_gemv(x, weight, bias, None, residual, 1e-5, 0.0, 0, config,
                          weight_scale=scale, counts=counts)
    want = reference.row_gemv(x, weight, bias, None, residual, 1e-5, 0.0, 0,
                              weight_scale=scale)
    assert _error(got, want) < 1e-5
    assert not counts.any()
    with pytest.raises(ValueError, match="int32 zeros needed"):
        launch_row_gemv(x, weight, bias, None, residual, 1e-5, 0.0, 0, config,
                        weight_scale=scale)


@pytest.mark.cuda
@pytest.mark.parametrize("config", [None, (4, 512, 4, 4096, 2), (8, 512, 8, 2048, 4)])
def test_split_gemv_as_a_dependent_launch_waits_for_what_it_reads(config):
    """The ~1.1B's down in a chain, each call reading the one before's output, started
    as programmatic dependent launches in a CUDA graph, one counter buffer for all:
    the reference's numbers on each replay, the counters at zero after it."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("dependent launches need a Hopper GPU")
    from targets.aoti.kernels.split_gemv_triton import launch_split_gemv, split_counters
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    torch.manual_seed(13)
    cuda = dict(device="cuda", dtype=torch.float16)
    hidden, inter = 2048, 5632
    ups = [torch.randn(inter, hidden, **cuda) * 0.02 for _ in range(3)]
    downs = [torch.randn(hidden, inter, **cuda) * 0.02 for _ in range(3)]
    x = torch.randn(1, 1, hidden, **cuda)
    counts = split_counters(downs[0], config)

    def chain(up_gemv, down_gemv):
        h = x
        for up, down in zip(ups, downs):
            h = down_gemv(up_gemv(h, up, None, None, None, 1e-5, 0.0, 0), down, h)
        return h

    want = chain(reference.row_gemv, lambda a, w, r: reference.row_gemv(
        a, w, None, None, r, 1e-5, 0.0, 0)).float()
    up = lambda *a: launch_row_gemv(*a, pdl=True)  # noqa: E731
    down = lambda a, w, r: launch_split_gemv(a, w, None, r, counts, config, pdl=True)  # noqa: E731
    chain(up, down)  # compiled before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = chain(up, down)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert _error(got, want) < 5e-3
        assert not counts.any()


@pytest.mark.cuda
def test_int8_down_as_the_library_launches_it_is_split_and_waits_for_what_it_reads():
    """The ~1.1B's int8 down through launch_row_gemv as a dependent launch with counters
    (gemv_config's choice: split in 11 parts of 512 columns), chained with gate/up in a CUDA graph,
    the counters shared by the layers: the reference's numbers each replay, the
    counters at zero after it."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("dependent launches need a Hopper GPU")
    from targets.aoti.kernels.triton_kernels import gemv_config, launch_row_gemv
    assert gemv_config(2048, 5632, False, True, 1, 132, True)[-1] == 11
    torch.manual_seed(17)
    hidden, inter = 2048, 5632

    def int8(rows, cols):
        return (torch.randint(-127, 128, (rows, cols), device="cuda", dtype=torch.int8),
                torch.rand(rows, device="cuda") * 2e-4 + 1e-4)
    ups = [int8(2 * inter, hidden) for _ in range(3)]
    downs = [int8(hidden, inter) for _ in range(3)]
    norm = torch.rand(hidden, device="cuda", dtype=torch.float16) + 0.5
    x = torch.randn(1, 1, hidden, device="cuda", dtype=torch.float16)
    counts = torch.zeros(hidden, device="cuda", dtype=torch.int32)

    def chain(gemv, **extra):
        h = x
        for (up, up_scale), (down, down_scale) in zip(ups, downs):
            gated = gemv(h, up, None, norm, None, 1e-5, 0.0, 1, weight_scale=up_scale)
            h = gemv(gated, down, None, None, h, 1e-5, 0.0, 0, weight_scale=down_scale,
                     **extra)
        return h

    want = chain(reference.row_gemv).float()
    dependent = lambda *a, **named: launch_row_gemv(*a, pdl=True, **named)  # noqa: E731
    chain(dependent, counts=counts)  # compiled before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = chain(dependent, counts=counts)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert _error(got, want) < 5e-3
        assert not counts.any()


@pytest.mark.cuda
def test_a_library_splits_its_int8_down_with_the_counters_it_is_given(tmp_path):
    """An int8 product with long rows and counters, compiled by AOTInductor inside
    dependent_launches(): the library loads the split kernel's ``_gdc`` form and nothing
    else (no copy of the counters, which it leaves at zero; no fill). Numbers: the
    1.1B build's validation gate, as test_dependent_launch.py says."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("dependent launches need a Hopper GPU")
    import re

    from targets.aoti.kernels import dependent_launch, ops
    hidden, inter = 256, 4096

    class Down(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("weight", torch.randint(-127, 128, (hidden, inter),
                                                         device="cuda", dtype=torch.int8))
            self.register_buffer("scale", torch.rand(hidden, device="cuda") * 1e-3)

        def forward(self, x, residual, counts):
            return ops.row_gemv(x, self.weight, None, None, residual, 1e-5, 0.0, 0,
                                self.scale, None, None, 0, 0, counts)

    inputs = (torch.randn(1, 1, inter, device="cuda", dtype=torch.float16),
              torch.randn(1, 1, hidden, device="cuda", dtype=torch.float16),
              torch.zeros(hidden, device="cuda", dtype=torch.int32))
    program = torch.export.export(Down().eval(), inputs)
    with dependent_launch.dependent_launches() as dependent:
        assert dependent
        path, source = compile_library(program, tmp_path / "d.pt2")
    loaded = set(re.findall(r'loadKernel\(\s*(?:"[^"]*"|\w+)\s*,\s*"(\w+)"', source))
    assert loaded == {"split_gemv_kernel_gdc"}
