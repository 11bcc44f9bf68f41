"""The streaming persistent MLP kernel (bench/persistent_mlp_stream.py): its tile plan
covers every row and column of the three products once, each program's share within a
tile of the others', and the ring fits shared memory (plain Python); compiled offline
for sm_90a where Triton 3.6's Gluon is installed (no spills, the planned shared bytes);
on a GPU, one small layer against reference.row_gemv's math."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from bench.persistent_mlp_stream import SMALL
from bench.stream_mlp_launch import (DEFAULT_CONFIG, SHARED_LIMIT, STREAM_CONFIGS, plan,
                                     real_bytes, tiles)


def _cases():
    hidden, inter, small = SMALL
    yield from ((2048, 5632, config, 128) for config in STREAM_CONFIGS.values())
    yield from ((hidden, inter, small, programs) for programs in (16, 128))
    yield 2048, 5632, DEFAULT_CONFIG, 64  # a smaller grid: more turns a program


@pytest.mark.parametrize("hidden,inter,config,programs", list(_cases()))
def test_the_tiles_cover_each_product_once_and_the_programs_within_a_tile(
        hidden, inter, config, programs):
    found = plan(hidden, inter, programs, config)
    rows, chunks, width = config[:3]
    listed = [tiles(found, pid) for pid in range(programs)]
    every = [tile for program in listed for tile in program]
    assert len(set(every)) == len(every)  # no tile twice
    for name, (n, k) in {"o": (hidden, hidden), "gate_up": (2 * inter, hidden),
                         "down": (hidden, inter)}.items():
        mine = [t for t in every if t[0] == name]
        assert all(row % rows == 0 and column % (chunks * width) == 0
                   for _, row, column in mine)
        # aligned, distinct tiles whose real bytes sum to the matrix's: each weight once
        assert sum(real_bytes(found, t) for t in mine) == n * k * 2
        # row blocks dealt in turns: programs apart by one row block at most
        shares = [sum(real_bytes(found, t) for t in program if t[0] == name)
                  for program in listed]
        assert max(shares) - min(shares) <= found[name][3] * found["tile_bytes"]
    if (hidden, inter, programs) == (2048, 5632, 128):  # the 1.1B: within one tile
        shares = [sum(real_bytes(found, t) for t in program) for program in listed]
        assert max(shares) - min(shares) <= found["tile_bytes"]
    # every program takes the same number of tiles: the ring's phases line up
    assert len({len(program) for program in listed}) == 1
    assert found["shared_bytes"] <= SHARED_LIMIT


def _summed_by_tiles(layer: dict, found: dict) -> tuple:
    """The kernel's arithmetic with each program's tiles in Python: a tile's rows times
    its columns of x, rows summed over their tiles, the epilogues after."""
    rows, chunks, width = found["config"][:3]
    columns = chunks * width

    def product(name, weight, x):
        sums = torch.zeros(weight.shape[0] + rows)  # room for a tile past the edge
        for pid in range(found["programs"]):
            for _, row, column in (t for t in tiles(found, pid) if t[0] == name):
                block = weight[row:row + rows, column:column + columns].float()
                sums[row:row + block.shape[0]] += block @ x[column:column + columns]
        return sums[:weight.shape[0]]
    o = (product("o", layer["o_weight"], layer["attn"].reshape(-1).float())
         + layer["hidden"].reshape(-1).float()).half()
    x = (o.float() * torch.rsqrt(o.float().pow(2).mean() + 1e-5)
         * layer["norm_weight"].float())
    raw = product("gate_up", layer["gate_up_weight"], x)
    gate, up = raw.chunk(2)
    gated = (torch.nn.functional.silu(gate) * up).half().float()
    return o, (product("down", layer["down_weight"], gated) + o.float()).half()


@pytest.mark.parametrize("programs", [4, 128])
def test_the_tiles_summed_as_the_kernel_sums_them_give_the_reference(programs):
    from targets.aoti.kernels.reference import row_gemv
    hidden, inter, config = 256, 768, (8, 8, 32, 4, 8)  # 256 columns a tile: 3 down parts
    generator = torch.Generator().manual_seed(3)
    made = {name: torch.randn(size, generator=generator).half() for name, size in {
        "attn": (1, 1, hidden), "hidden": (1, 1, hidden), "o_weight": (hidden, hidden),
        "norm_weight": (hidden,), "gate_up_weight": (2 * inter, hidden),
        "down_weight": (hidden, inter)}.items()}
    for name, scale in (("o_weight", hidden), ("gate_up_weight", hidden),
                        ("down_weight", inter)):
        made[name] = (made[name].float() * scale ** -0.5).half()
    o, out = _summed_by_tiles(made, plan(hidden, inter, programs, config))
    want_o = row_gemv(made["attn"], made["o_weight"], None, None, made["hidden"], 1e-5,
                      0.0, 0)
    gated = row_gemv(want_o, made["gate_up_weight"], None, made["norm_weight"], None,
                     1e-5, 0.0, 1)
    want = row_gemv(gated, made["down_weight"], None, None, want_o, 1e-5, 0.0, 0)
    assert (o.float() - want_o.reshape(-1).float()).abs().max() < 4e-3
    assert (out.float() - want.reshape(-1).float()).abs().max() < 8e-3


def test_the_1b_plan_is_whole_turns_for_128_programs():
    """8 rows x 2,048 columns: o two tiles a program, gate/up 11, down 2 rows of 3."""
    found = plan(2048, 5632, 128)
    assert (found["o"][2:], found["gate_up"][2:], found["down"][2:]) == (
        (2, 1), (11, 1), (2, 3))
    assert found["tile_bytes"] == 32768
    assert found["shared_bytes"] == 6 * 32768 + 3 * 2048 * 4 + 6 * 8


@pytest.mark.parametrize("config,programs,message", [
    ((8, 8, 256, 7, 8), 128, "shared memory"),  # 7 slots of 32 KB and x: too many
    ((8, 8, 256, 6, 8), 96, "power of two"),
    ((6, 8, 256, 6, 8), 128, "power of two"),
    ((8, 8, 512, 2, 8), 128, "256 at most"),
    ((4, 8, 256, 6, 8), 128, "warps"),
])
def test_a_plan_the_kernel_cannot_lay_out_is_refused(config, programs, message):
    with pytest.raises(ValueError, match=message):
        plan(2048, 5632, programs, config)


def test_widths_off_the_chunk_are_refused():
    with pytest.raises(ValueError, match="multiples of the chunk"):
        plan(2048, 5600, 128)


def _gluon() -> bool:
    return importlib.util.find_spec("triton") is not None and importlib.util.find_spec(
        "triton.experimental.gluon") is not None


@pytest.mark.skipif(not _gluon(), reason="needs Triton 3.6 with Gluon")
def test_the_kernel_compiles_for_sm90a_without_spills():
    from bench.stream_mlp_launch import resources
    found = resources(DEFAULT_CONFIG)
    assert 0 < found["registers"] <= 255 and found["spilled_bytes"] == 0
    # the ring and x as planned, and little else (the compiler's scratch)
    assert found["planned_shared_bytes"] <= found["shared_bytes"] <= SHARED_LIMIT
    assert found["shared_bytes"] - found["planned_shared_bytes"] < 1024


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available()
                    or torch.cuda.get_device_capability()[0] < 9,
                    reason="TMA and the grid barrier need a Hopper GPU")
def test_a_small_layer_matches_three_row_gemvs_on_the_gpu():
    from bench.persistent_mlp_stream import _diff, _expected, _layer
    from bench.stream_mlp_launch import launch_stream_mlp
    hidden, inter, config = SMALL
    layer = _layer(hidden, inter, 0)
    sync = torch.zeros(2, dtype=torch.int32, device="cuda")
    o, out = launch_stream_mlp(**layer, sync=sync, eps=1e-5, config=config, programs=16,
                               pdl=True)
    want_o, want_out = _expected(layer)
    assert _diff(o, want_o)[1] < 8e-3 and _diff(out, want_out)[1] < 8e-3
    assert sync.tolist() == [32, 0]  # 16 programs at two barriers, none given up
