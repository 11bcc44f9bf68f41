"""gate/up and down as one launch (kernels/mlp_triton.py) against reference.row_gemv's
composition: exactly where every sum is exact, within rounding otherwise, both
accumulators (fp32 atomics, int64 fixed point), the accumulator and counter left at
zero call after call, the fixed point's result the same whatever the grid, the bad
buffers refused. On a GPU, or on the CPU under ``TRITON_INTERPRET=1`` (the ``_gdc``
form on a Hopper GPU only)."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels import reference
from tests.helpers import triton_device

pytest.importorskip("triton")

# (BLOCK_N, BLOCK_K, warps, AHEAD, TURNS): no block divides I, a column loop or none,
# one turn, many turns, more turns than blocks (programs with nothing to do)
CONFIGS = [(2, 16, 4, 16, 3), (4, 32, 4, 64, 1), (1, 16, 2, 32, 40), (8, 16, 4, 32, 2)]


def _want(x, gate_up, down_t, norm, residual, act=1):
    gated = reference.row_gemv(x, gate_up, None, norm, None, 1e-5, 0.0, act)
    return reference.row_gemv(gated, down_t.t(), None, None, residual, 0.0, 0.0, 0)


def _made(device, inter=37, cols=48, out=40, seed=0, dtype=torch.float16):
    generator = torch.Generator().manual_seed(seed)

    def made(*size, scale=1.0, shift=0.0):
        return (torch.randn(size, generator=generator) * scale + shift).to(device, dtype)
    return (made(1, 1, cols), made(2 * inter, cols, scale=cols ** -0.5),
            made(inter, out, scale=inter ** -0.5), made(cols, scale=0.2, shift=1.0),
            made(1, 1, out))


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("config", CONFIGS)
def test_gated_mlp_equals_the_reference_where_every_sum_is_exact(config, fixed):
    """Small integers (float32 x, no activation): every sum is exact, so a row of gate
    or of down_t summed twice or lost, or a partial added twice, shows."""
    device = triton_device()
    from targets.aoti.kernels.mlp_triton import launch_gated_mlp, mlp_accumulator
    generator = torch.Generator().manual_seed(3)
    inter, cols, out = 37, 45, 40  # no block divides I, N padded to 64

    def ints(*size, top=4):
        return torch.randint(-top, top + 1, size, generator=generator).float().to(device)
    x, gate_up, down_t, residual = ints(1, 1, cols), ints(inter, cols), ints(inter, out), \
        ints(1, 1, out, top=99)
    acc, counts = mlp_accumulator(out, fixed, device)
    got = launch_gated_mlp(x, gate_up, down_t, None, residual, 1e-5, 0.0, 0, acc, counts,
                           config)
    want = _want(x, gate_up, down_t, None, residual, act=0)
    assert got.dtype == torch.float32 and got.shape == want.shape == (1, 1, out)
    assert torch.equal(got, want)
    assert not acc.any() and not counts.any()


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("config", [None, CONFIGS[0], CONFIGS[2]])
def test_gated_mlp_leaves_its_buffers_at_zero_call_after_call(config, fixed):
    """One acc and counter over calls with and without the norm and the residual (fp16,
    SiLU x up): each the composition's numbers within rounding, both at zero after."""
    device = triton_device()
    from targets.aoti.kernels.mlp_triton import launch_gated_mlp, mlp_accumulator
    acc, counts = mlp_accumulator(40, fixed, device)
    for call, (norm, res) in enumerate([(True, True), (False, True), (True, False),
                                        (False, False)]):
        x, gate_up, down_t, norm_weight, residual = _made(device, seed=call)
        args = (norm_weight if norm else None, residual if res else None)
        got = launch_gated_mlp(x, gate_up, down_t, *args[:1], args[1], 1e-5, 0.0, 1, acc,
                               counts, config)
        want = _want(x, gate_up, down_t, *args)
        assert got.dtype == torch.float16, call
        # one fp16 rounding of the output (the gated values round as the pair's do)
        assert (got.float() - want.float()).abs().max() <= 2e-3 * want.abs().max(), call
        assert not acc.any() and not counts.any(), call


def test_the_fixed_point_sum_is_the_same_whatever_the_grid():
    """int64 accumulation: bit-identical over calls and over grids of the same BLOCK_N
    (every block's sum rounded before it is added, so the order does not matter)."""
    device = triton_device()
    from targets.aoti.kernels.mlp_triton import launch_gated_mlp, mlp_accumulator
    x, gate_up, down_t, norm_weight, residual = _made(device, inter=61, out=24, seed=7)
    acc, counts = mlp_accumulator(24, True, device)
    found = [launch_gated_mlp(x, gate_up, down_t, norm_weight, residual, 1e-5, 0.0, 1, acc,
                              counts, (2, 16, 4, 16, turns)) for turns in (1, 1, 3, 31)]
    assert all(torch.equal(found[0], each) for each in found[1:])
    assert not acc.any() and not counts.any()


def test_gated_mlp_takes_other_activations_and_bf16():
    device = triton_device()
    from targets.aoti.kernels.mlp_triton import launch_gated_mlp, mlp_accumulator
    x, gate_up, down_t, norm_weight, residual = _made(device, seed=9, dtype=torch.bfloat16)
    acc, counts = mlp_accumulator(40, False, device)
    for act in (2, 3):
        got = launch_gated_mlp(x, gate_up, down_t, norm_weight, residual, 1e-5, 0.5, act,
                               acc, counts, (4, 16, 4, 32, 2))
        want = reference.row_gemv(reference.row_gemv(
            x, gate_up, None, norm_weight, None, 1e-5, 0.5, act), down_t.t(), None, None,
            residual, 0.0, 0.0, 0)
        assert got.dtype == torch.bfloat16
        assert (got.float() - want.float()).abs().max() <= 2e-2 * want.abs().max(), act


def test_gated_mlp_refuses_wrong_buffers_and_shapes():
    device = triton_device()
    from targets.aoti.kernels.mlp_triton import launch_gated_mlp
    x, gate_up, down_t, norm_weight, residual = _made(device)
    counts = torch.zeros(1, dtype=torch.int32, device=device)
    call = lambda acc, counts, down=down_t: launch_gated_mlp(  # noqa: E731
        x, gate_up, down, norm_weight, residual, 1e-5, 0.0, 1, acc, counts)
    for acc in (None, torch.zeros(40, dtype=torch.float16, device=device),
                torch.zeros(39, device=device)):
        with pytest.raises(ValueError, match="acc: 40 float32 or int64 zeros"):
            call(acc, counts)
    for bad in (None, torch.zeros(1, dtype=torch.int64, device=device),
                torch.zeros(0, dtype=torch.int32, device=device)):
        with pytest.raises(ValueError, match="counts: 1 int32 zero"):
            call(torch.zeros(40, device=device), bad)
    with pytest.raises(ValueError, match="do not fit"):
        call(torch.zeros(40, device=device), counts, down_t[1:])


def test_mlp_config_fills_the_gpu_in_one_wave():
    from targets.aoti.kernels.mlp_triton import mlp_config
    block_n, block_k, warps, ahead, turns = mlp_config(5632, 2048, 2048, 132)
    assert (block_n, block_k, warps, ahead) == (2, 512, 8, 2048)
    assert -(-5632 // block_n // turns) <= 2 * 132 < -(-5632 // block_n // (turns - 1))


@pytest.mark.cuda
@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("config", [None, (4, 512, 8, 2048, 11)])
def test_gated_mlp_as_a_dependent_launch_waits_for_what_it_reads(config, fixed):
    """The ~1.1B's MLP (2,048 hidden, 5,632 intermediate) in a chain of three layers,
    each reading the one before's output, plain and as programmatic dependent launches
    in a CUDA graph, one acc and counter for all: the composition's numbers each replay,
    the buffers at zero after it (mlp_config's default, and the chain's 4 rows a
    block: the same compiled kernels as the chain's variants)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("dependent launches need a Hopper GPU")
    from targets.aoti.kernels.mlp_triton import launch_gated_mlp, mlp_accumulator
    torch.manual_seed(19)
    cuda = dict(device="cuda", dtype=torch.float16)
    hidden, inter = 2048, 5632
    ups = [torch.randn(2 * inter, hidden, **cuda) * 0.02 for _ in range(3)]
    downs = [torch.randn(inter, hidden, **cuda) * 0.02 for _ in range(3)]
    norm = torch.rand(hidden, **cuda) + 0.5
    x = torch.randn(1, 1, hidden, **cuda)
    acc, counts = mlp_accumulator(hidden, fixed, "cuda")

    def chain(mlp):
        h = x
        for up, down_t in zip(ups, downs):
            h = mlp(h, up, down_t)
        return h

    want = chain(lambda h, up, down_t: _want(h, up, down_t, norm, h)).float()
    for pdl in (False, True):
        def mlp(h, up, down_t):
            return launch_gated_mlp(h, up, down_t, norm, h, 1e-5, 0.0, 1, acc, counts,
                                    config, pdl)
        chain(mlp)  # compiled before capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = chain(mlp)
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            error = ((got.float() - want).norm() / want.norm()).item()
            assert error < 5e-3, (pdl, error)
            assert not acc.any() and not counts.any()


@pytest.mark.parametrize("fixed", [False, True])
def test_gated_mlp_over_int8_rows_applies_each_scale_once(fixed):
    """int8 gate/up (a scale a row) and down (a scale an output column, applied at the
    join, once, not once a program), fp16 x."""
    device = triton_device()
    from targets.aoti.kernels.mlp_triton import launch_gated_mlp, mlp_accumulator
    generator = torch.Generator().manual_seed(11)
    inter, cols, out = 37, 48, 40

    def int8(rows, width):
        return (torch.randint(-127, 128, (rows, width), generator=generator,
                              dtype=torch.int8).to(device),
                (torch.rand(rows, generator=generator) * 2e-3 + 1e-3).to(device))
    (gate_up, up_scale), (down, down_scale) = int8(2 * inter, cols), int8(out, inter)
    x, _, _, norm_weight, residual = _made(device, inter, cols, out, seed=12)
    acc, counts = mlp_accumulator(out, fixed, device)
    for turns in (1, 3):
        got = launch_gated_mlp(x, gate_up, down.t().contiguous(), norm_weight, residual,
                               1e-5, 0.0, 1, acc, counts, (4, 16, 4, 32, turns),
                               gate_up_scale=up_scale, down_scale=down_scale)
        gated = reference.row_gemv(x, gate_up, None, norm_weight, None, 1e-5, 0.0, 1,
                                   weight_scale=up_scale)
        want = reference.row_gemv(gated, down, None, None, residual, 0.0, 0.0, 0,
                                  weight_scale=down_scale)
        assert (got.float() - want.float()).abs().max() <= 2e-3 * want.abs().max(), turns
        assert not acc.any() and not counts.any()
    with pytest.raises(ValueError, match="both scales"):
        launch_gated_mlp(x, gate_up, down.t().contiguous(), norm_weight, residual, 1e-5,
                         0.0, 1, acc, counts, gate_up_scale=up_scale)
