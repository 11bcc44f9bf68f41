"""bench/decode_chain_dot4.py: the int8 chain's variants over x's int8 codes are the
int8 base with only the named products replaced, each calling the library's launch."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.helpers import triton_device


def test_variants_change_only_their_products():
    from bench.decode_chain_dot4 import BASE, CHANGES, Dot4Rows, dot4_variants
    base = (True, {"qkv": (4, 1024, 4, 2048), "o": (2, 512, 4, 2048)}, None, True)
    found = dot4_variants({BASE: base})
    heads = {f"{BASE} + dot4 q32 gate/up 8 rows + head argmax{codes}"
             for codes in ("", " x codes")}
    assert set(found) - heads == {f"{BASE} + {name}" for name in CHANGES}
    if importlib.util.find_spec("triton"):  # the head's token kernel: over x's codes too
        head = found[f"{BASE} + dot4 q32 gate/up 8 rows + head argmax x codes"][1]["head"]
        assert head.fused and head.x_qblock == 32 and heads <= set(found)
    pdl, configs, *rest = found[f"{BASE} + dot4 q32 gate/up 8 rows"]
    assert (pdl, rest) == (True, [None, True])
    assert configs["o"] == (2, 512, 4, 2048) and configs["qkv"] == (4, 1024, 4, 2048)
    assert isinstance(configs["gate_up"], Dot4Rows) and configs["gate_up"].qblock == 32
    assert dot4_variants({}) == {}


def test_a_variant_product_is_the_library_launch():
    pytest.importorskip("triton")
    device = triton_device()
    from bench.decode_chain_dot4 import Dot4Rows
    from targets.aoti.kernels.reference import row_gemv
    weight = torch.randint(-127, 128, (16, 128), dtype=torch.int8, device=device)
    scale = torch.full((16,), 1e-2, device=device)
    x = torch.randn(1, 1, 128).half().to(device)
    norm = torch.ones(128, dtype=torch.float16, device=device)
    got = Dot4Rows((4, 64, 4, 0), 32)(x, weight, scale, {"norm": norm, "act": 1}, False)
    want = row_gemv(x, weight, None, norm, None, 1e-5, 0.0, 1, scale, x_qblock=32)
    assert (got.float() - want.float()).abs().max().item() < 2e-3


def test_down_variants_are_splits_whose_parts_are_whole_blocks():
    """Each down variant is gate/up's 8-row dot4 plus down as a split launch_row_gemv
    takes (7 long) whose parts of the ~1.1B's 5,632 columns are whole blocks of 32; the
    first is the library's own split_config."""
    pytest.importorskip("triton")
    from bench.decode_chain_dot4 import (BASE, CHANGES, DOWNS, GATE_UP8, Dot4Rows,
                                         dot4_variants)
    from targets.aoti.kernels.split_gemv_triton import codes_fit, split_config
    block_n, block_k, warps, ahead, split = split_config(5632)
    assert DOWNS["11 parts 8 rows"] == (block_n, block_k, warps, ahead, False, 0, split)
    found = dot4_variants({BASE: (True, {"down": split_config(5632)}, None, True)})
    for name, down in DOWNS.items():
        qblock, products = CHANGES[f"dot4 q32 gate/up 8 rows + down {name}"]
        assert products == {"gate_up": GATE_UP8, "down": down}
        assert len(down) == 7 and codes_fit(torch.zeros(1, 5632, dtype=torch.int8),
                                            (*down[:4], down[6]), qblock), name
        configs = found[f"{BASE} + dot4 q32 gate/up 8 rows + down {name}"][1]
        assert isinstance(configs["down"], Dot4Rows) and configs["down"].config == down


def test_a_split_variant_product_is_the_library_split_launch():
    """Dot4Rows with a split configuration: launch_row_gemv's split route over x's
    codes, its own counters made once and left at zero, layer after layer."""
    pytest.importorskip("triton")
    device = triton_device()
    from bench.decode_chain_dot4 import Dot4Rows
    from targets.aoti.kernels.reference import row_gemv
    down = Dot4Rows((8, 64, 4, 64, False, 0, 4), 32)
    for layer in range(2):
        generator = torch.Generator().manual_seed(layer)
        weight = torch.randint(-127, 128, (16, 256), generator=generator, dtype=torch.int8)
        scale = torch.full((16,), 1e-2, device=device)
        x = torch.randn(1, 1, 256, generator=generator).half().to(device)
        residual = torch.randn(1, 1, 16, generator=generator).half().to(device)
        weight = weight.to(device)
        got = down(x, weight, scale, {"residual": residual}, False)
        want = row_gemv(x, weight, None, None, residual, 1e-5, 0.0, 0, scale, x_qblock=32)
        assert (got.float() - want.float()).abs().max().item() < 2e-3 * want.abs().max().item()
        counts = down.counts
        assert counts is not None and not counts.any()
    assert down.counts is counts
