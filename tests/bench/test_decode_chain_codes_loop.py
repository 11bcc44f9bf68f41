"""bench/decode_chain_codes_loop.py: the int8 chain's row-loop variants over x's int8
codes are the int8 base with only the named products replaced."""

from __future__ import annotations


def test_variants_change_only_their_products():
    from bench.decode_chain_codes_loop import BASE, CHANGES, CodesLoop, codes_loop_variants
    base = (True, {"qkv": (4, 1024, 4, 2048), "o": (2, 512, 4, 2048)}, None, True)
    found = codes_loop_variants({BASE: base})
    assert set(found) == {f"{BASE} + {name}" for name in CHANGES}
    pdl, configs, *rest = found[f"{BASE} + codes loop gate/up 4 rows 4 a SM"]
    assert (pdl, rest) == (True, [None, True])
    assert configs["o"] == (2, 512, 4, 2048) and configs["qkv"] == (4, 1024, 4, 2048)
    assert isinstance(configs["gate_up"], CodesLoop) and configs["gate_up"].config == (4, 4, 4)
    assert codes_loop_variants({}) == {}
