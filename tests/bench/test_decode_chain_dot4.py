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

