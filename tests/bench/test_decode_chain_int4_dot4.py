"""bench/decode_chain_int4_dot4.py: the int4 chain's variants over x's int8 codes are the
int4 attention-o base with only the named products replaced, q/k/v keeping its rotary
fold, each calling the library's launch with ``x_qblock``."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import triton_device


def test_variants_change_only_their_products():
    from bench.decode_attention_o import AttentionO
    from bench.decode_chain_int4 import Int4Launch
    from bench.decode_chain_int4_dot4 import BASE, CHANGES, Dot4Launch, int4_dot4_variants
    rotary = ("cos", "sin", 2304, 64)
    built = {name: Int4Launch(None, rotary if name == "qkv" else ())
             for name in ("qkv", "o", "gate_up", "down", "head")}
    found = int4_dot4_variants({"int4 dependent + join": (True, built, None, True)})
    assert set(found) == {f"{BASE} + {name}" for name in CHANGES}
    for name, (pdl, configs, ahead, join) in found.items():
        assert pdl and join and ahead is None and "," not in name
        assert isinstance(configs["attention_o"], AttentionO)
        assert configs["attention_o"].config == (4, 4, 4)  # the int4 library's
        qblock, products = CHANGES[name[len(BASE) + 3:]]
        for product, launch in configs.items():
            if product in products:
                assert isinstance(launch, Dot4Launch) and launch.qblock == qblock
                assert launch.config == products[product]
                assert launch.rotary == (rotary if product == "qkv" else ())
            else:
                assert launch is built.get(product, launch)
    assert int4_dot4_variants({}) == {}


def test_a_variant_product_is_the_library_launch():
    pytest.importorskip("triton")
    device = triton_device()
    from bench.decode_chain_int4_dot4 import Dot4Launch
    from targets.aoti.kernels import int4_rows
    from targets.aoti.kernels.reference import row_gemv
    generator = torch.Generator().manual_seed(3)
    packed, scales = int4_rows.pack(torch.randn(32, 256, generator=generator) * 0.05, 128)
    packed, scales = packed.to(device), scales.to(device)
    x = torch.randn(1, 1, 256, generator=generator).half().to(device)
    norm = torch.ones(256, dtype=torch.float16, device=device)
    got = Dot4Launch((4, 2, 4), 32)(x, packed, scales, {"norm": norm, "act": 1}, False)
    want = row_gemv(x, packed, None, norm, None, 1e-5, 0.0, 1, scales, x_qblock=32)
    assert (got.float() - want.float()).abs().max().item() < 2e-3
