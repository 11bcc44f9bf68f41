"""bench/down_fit_rows.py's int8 rows split along K in tiles that fit their part, against
reference.row_gemv and the float64 product: the tile rule's cover of a part, the folds
(scales, residual), the counters left at zero, the chain variants. Under TRITON_INTERPRET=1 on the CPU, or on a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import triton_device

pytest.importorskip("triton")

def test_pieces_are_a_widths_own_bits():
    from bench.down_fit_rows import fit_pieces
    assert fit_pieces(1408) == (1024, 256, 128)  # the ~1.1B's down in 4 parts
    assert fit_pieces(2816) == (2048, 512, 256)  # in 2
    assert fit_pieces(2048) == (2048, 0, 0)
    assert fit_pieces(1400) == (1024, 256, 128)  # rounded up to 16 columns
    assert fit_pieces(1488) == (1024, 256, 256)  # four bits: the third rounded up
    for width in range(16, 8193, 16):
        pieces = fit_pieces(width)
        assert all(p == 0 or p >= 16 and p & (p - 1) == 0 for p in pieces)
        assert list(pieces) == sorted(pieces, reverse=True)
        if bin(width // 16).count("1") <= 3:
            assert sum(pieces) == width
        assert width <= sum(pieces) <= width * 8 / 7


@pytest.mark.parametrize("part, ahead, block_k, plan", [
    (1408, 2048, 1024, (1024, 256, 128, 1408, 1408, 0, 0, 0)),  # held whole
    (2752, 2048, 1024, (2048, 0, 0, 2048, 2048, 512, 128, 64)),  # a 7B's 11,008 / 4
    (5000, 1024, 1024, (1024, 0, 0, 1024, 4096, 512, 256, 256)),  # tiles, then a tail
    (300, 0, 64, (0, 0, 0, 0, 256, 32, 16, 0)),  # nothing held (a plain launch's)
])
def test_a_plan_covers_its_part_once(part, ahead, block_k, plan):
    from bench.down_fit_rows import fit_plan
    got = fit_plan(part, ahead, block_k)
    assert tuple(got[k] for k in ("A1", "A2", "A3", "HELD", "LOOP_END", "T1", "T2",
                                  "T3")) == plan
    assert got["LOOP_END"] + got["T1"] + got["T2"] + got["T3"] >= part
    assert (got["LOOP_END"] - got["HELD"]) % block_k == 0


def _rows(n, k, device, seed):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randint(-128, 128, (n, k), generator=generator, dtype=torch.int8)
    scale = torch.rand(n, generator=generator) * 2e-2 + 1e-2
    return weight.to(device), scale.to(device, torch.float16)


CONFIGS = [  # (BLOCK_N, BLOCK_K, warps, AHEAD, SPLIT) over (rows, columns)
    ((4, 64, 4, 2048, 4), (36, 704)),  # parts of 176 = 128 + 32 + 16, held whole
    ((2, 128, 4, 64, 3), (37, 900)),  # 300: 64 held, a tile, a tail of 108 -> 64 + 32 + 16
    ((8, 64, 4, 0, 2), (40, 200)),  # nothing held: a tile, then a tail of 36 -> 32 + 16
    ((4, 64, 2, 128, 5), (41, 523)),  # 105 -> 64 + 32 + 16, the last part 103, a block 1
]


@pytest.mark.parametrize("config, shape", CONFIGS)
def test_integer_sums_are_exact(config, shape):
    """Scale 1, x small integers: every part's sum and their join exact, so a column
    summed twice, lost or moved shows; the counters are left at zero."""
    device = triton_device()
    from bench.down_fit_rows import launch_fit_split
    from targets.aoti.kernels.split_gemv_triton import split_counters
    n, k = shape
    weight, _ = _rows(n, k, device, 4)
    x = (torch.arange(k, device=device) % 7 - 3).float().reshape(1, 1, k)
    residual = (torch.arange(n, device=device) % 11 - 5).float().reshape(1, 1, n)
    counts = split_counters(weight, config)
    got = launch_fit_split(x, weight, torch.ones(n, device=device), residual, counts,
                           config)
    want = weight.double() @ x.double().reshape(-1) + residual.double().reshape(-1)
    assert torch.equal(got.double().reshape(-1), want), config
    assert not counts.any()


@pytest.mark.parametrize("config, shape", CONFIGS)
def test_fitted_split_rows_are_row_gemvs(config, shape):
    """fp16 x, int8 rows with their scales, with and without a residual, two calls on
    one buffer of counters: reference.row_gemv's numbers."""
    device = triton_device()
    from bench.down_fit_rows import launch_fit_split
    from targets.aoti.kernels.reference import row_gemv
    from targets.aoti.kernels.split_gemv_triton import split_counters
    n, k = shape
    weight, scale = _rows(n, k, device, 6)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(1, 1, k, generator=generator).to(device, torch.float16)
    counts = split_counters(weight, config)
    for residual in (torch.randn(1, 1, n, generator=generator).to(device, torch.float16),
                     None):
        got = launch_fit_split(x, weight, scale, residual, counts, config)
        want = row_gemv(x, weight, None, None, residual, 1e-5, 0.0, 0, scale)
        assert got.dtype == torch.float16 and got.shape == want.shape
        error = (got.float() - want.float()).abs().max().item()
        assert error <= 2e-3 * max(1.0, want.float().abs().max().item()), error
    assert not counts.any()


def test_the_variants_change_only_down():
    from bench.decode_chain_split import SplitLaunch
    from bench.down_fit_rows import BASE, CHANGES, FitLaunch, chain_names, fit_variants
    default = {"qkv": (4, 1024, 4, 2048), "gate_up": (2, 1024, 4, 0),
               "down": (4, 1024, 4, 2048, False, 0, 4)}
    found = fit_variants({BASE: (True, default, None, True)})
    assert len(found) == len(CHANGES)
    pdl, configs, *rest = found[f"{BASE} + down fitted tiles 4 parts"]
    assert pdl and rest == [None, True]
    assert {k: v for k, v in configs.items() if k != "down"} == {
        k: v for k, v in default.items() if k != "down"}
    assert isinstance(configs["down"], FitLaunch)
    assert repr(configs["down"]) == "fit(4, 1024, 4, 2048, 4)"
    twin = found[f"{BASE} + down library 4 parts 8 rows"][1]["down"]
    assert isinstance(twin, SplitLaunch) and twin.config == (8, 1024, 4, 2048, 4)
    assert found[f"{BASE} + nothing changed"][1] == default
    names = chain_names()
    assert names[0] == BASE and names[-1] == f"{BASE} + nothing changed"
    assert set(names[1:]) == {f"{BASE} + {name}" for name in CHANGES}


def test_the_base_is_the_chains():
    """BASE is the int8 chain's attention-o base; decode_chain_cuda.py registers the
    variants."""
    from bench import decode_chain_cuda
    from bench.decode_attention_o import CHANGES
    from bench.down_fit_rows import BASE
    source = Path(decode_chain_cuda.__file__).read_text()
    assert "attention-o joined {8 if int8 else 4} splits 4 rows" in source
    assert BASE.removeprefix("dependent + join + ") in CHANGES
    assert "fit_variants(q_bases)" in source


@pytest.mark.cuda
def test_a_fitted_down_chain_replays_in_a_cuda_graph():
    """Two layers of the int8 chain at the ~1.1B's shape, down on the fitted kernel (4
    parts, 8 rows) as a dependent launch, captured and replayed: the base's plain
    launches' output each replay."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a Hopper GPU")
    from bench.decode_chain_cuda import step, variants, weights
    from bench.down_fit_rows import BASE
    torch.manual_seed(0)
    made = weights(2, 512, int8=True)
    hidden = torch.randn(1, 1, 2048, device="cuda", dtype=torch.float16)
    chosen = variants(None, True)
    pdl, configs, *rest = chosen[f"{BASE} + down fitted tiles 4 parts 8 rows"]
    want = step(made, hidden, False, chosen[BASE][1], *rest).float()  # the base, plain
    step(made, hidden, pdl, configs, *rest)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(made, hidden, pdl, configs, *rest)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        error = (out.float() - want).abs().max().item()
        assert error <= 2e-2 * max(1.0, want.abs().max().item()), error
