"""The chain's fused MLP variants (bench/decode_chain_mlp.py): the launch (its math:
tests/targets/aoti/test_mlp_triton.py) in the chain's place of gate/up and down computes
what the chain computes, its buffers left at zero; each variant is the base with that
launch, at fp16 and over int8 rows. On a GPU, or on the CPU under
``TRITON_INTERPRET=1``."""

from __future__ import annotations

import pytest
import torch

from tests.bench.test_decode_chain_split import _small_chain
from tests.helpers import triton_device

pytest.importorskip("triton")


def test_the_chain_with_one_mlp_launch_computes_what_the_chain_computes(monkeypatch):
    """Two layers on one acc and counter (the second layer's launch finds them at zero),
    each accumulator (plain launches: the interpreter has no dependent ones), each
    layer's down transposed once."""
    from bench.decode_chain_mlp import GatedMLP
    device = triton_device()
    chain, weights, hidden = _small_chain(monkeypatch, device, layers=2)
    want = chain.step(weights, hidden, False, {}, join=True).float()
    for fixed, config in [(False, (2, 16, 4, 32, 5)), (True, (4, 32, 8, 64, 2))]:
        mlp = GatedMLP(fixed, config)
        got = chain.step(weights, hidden, False, {"gate_up_down": mlp}, join=True).float()
        assert (got - want).abs().max().item() < 2e-2 * want.abs().max().item()
        assert not mlp.state["acc"].any() and not mlp.state["counts"].any()
        assert len(mlp.down_t) == 2
        assert mlp.state["acc"].dtype == (torch.int64 if fixed else torch.float32)


def test_the_chain_over_int8_rows_computes_what_it_computes(monkeypatch):
    """int8 rows (``--int8``): each scale applied once, the int64 accumulator."""
    from bench.decode_chain_mlp import GatedMLP
    device = triton_device()
    chain, weights, hidden = _small_chain(monkeypatch, device, int8=True)
    want = chain.step(weights, hidden, False, {}, join=True).float()
    mlp = GatedMLP(True, (4, 32, 4, 64, 3))
    got = chain.step(weights, hidden, False, {"gate_up_down": mlp}, join=True).float()
    assert (got - want).abs().max().item() < 2e-2 * want.abs().max().item()
    assert not mlp.state["acc"].any() and not mlp.state["counts"].any()
    assert mlp.down_t[id(weights["layers"][0]["down"][0])].dtype == torch.int8


def test_each_variant_is_the_base_with_the_fused_mlp():
    from bench.decode_chain_mlp import BASE, CHANGES, INT8_BASE, GatedMLP, mlp_variants
    base = {"qkv": (2, 16, 4, 32), "attention_o": "the launch"}
    found = mlp_variants({BASE: (True, base, None, True)}, 132)
    assert len(found) == len(CHANGES) + 1
    assert found[f"{BASE} + nothing changed"] == (True, base, None, True)
    launches = []
    for name, (pdl, configs, ahead, join) in found.items():
        assert pdl and join and ahead is None and name.startswith(f"{BASE} + ")
        assert "," not in name  # --variants splits on commas
        assert {k: v for k, v in configs.items() if k != "gate_up_down"} == base
        if name.endswith("nothing changed"):
            continue
        mlp = configs["gate_up_down"]
        assert isinstance(mlp, GatedMLP)
        fixed, per_sm, block_n, warps = CHANGES[name[len(BASE) + 3:]]
        assert mlp.fixed == fixed and mlp.config[0] == block_n and mlp.config[2] == warps
        assert -(-5632 // block_n // mlp.config[4]) <= per_sm * 132  # one wave
        launches.append(mlp)
    assert len({id(launch) for launch in launches}) == len(launches)  # buffers their own
    # a control given already is kept; each base its variants; no base, none
    given = {BASE: (True, base), f"{BASE} + nothing changed": (True, base)}
    assert len(mlp_variants(given, 132)) == len(CHANGES)
    both = mlp_variants({BASE: (True, base), INT8_BASE: (True, base)}, 132)
    assert len(both) == 2 * len(CHANGES) + 2
    assert sum(name.startswith(f"{INT8_BASE} + ") for name in both) == len(CHANGES) + 1
    assert mlp_variants({}, 132) == {}
