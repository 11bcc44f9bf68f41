"""The chain's q/k/v + attention + o variants (bench/decode_chain_qkv.py): the joined
launch (its math: tests/targets/aoti/test_qkv_attention_o.py) through the chain's hooks
computes what the chain computes, its counts and flags left as the next launch needs
them. On a GPU, or on the CPU under ``TRITON_INTERPRET=1``."""

from __future__ import annotations

import pytest
import torch

from tests.bench.test_decode_chain_split import _small_chain
from tests.helpers import triton_device

pytest.importorskip("triton")


@pytest.mark.parametrize("config", [(4, 16, 16, 2, 8, 4), (8, 0, 32, 4, 4, 2)])
def test_the_chain_with_one_launch_computes_what_the_chain_computes(monkeypatch, config):
    """Three layers on one set of buffers, twice (the interpreter has no dependent
    launches: plain ones there)."""
    from bench.decode_chain_qkv import QkvAttentionO, QkvRows
    device = triton_device()
    chain, weights, hidden = _small_chain(monkeypatch, device, layers=3, slots=24)
    weights["mask"][..., 20] = torch.finfo(torch.float16).min
    want = chain.step(weights, hidden, False, {}, join=True).float()
    joined = QkvAttentionO(config, own_plain=True)
    configs = {"qkv": QkvRows(own_plain=True), "attention_o": joined}
    for _ in range(2):
        got = chain.step(weights, hidden, False, configs, join=True).float()
        assert (got - want).abs().max().item() < 2e-2 * want.abs().max().item()
    assert not joined.state["counts"].any()
    # flag_slots(3): each layer counts its 2 key/value heads in, the last zeroes slot 0
    assert joined.state["flags"].view(3, -1)[:, 0].tolist() == [0, 2, 2]


def test_the_chain_with_int8_rows_computes_what_it_computes(monkeypatch):
    from bench.decode_chain_qkv import QkvAttentionO, QkvRows
    device = triton_device()
    chain, weights, hidden = _small_chain(monkeypatch, device, layers=1, slots=16,
                                          int8=True)
    want = chain.step(weights, hidden, False, {}, join=True).float()
    configs = {"qkv": QkvRows(own_plain=True),
               "attention_o": QkvAttentionO((8, 16, 16, 2, 4, 4), own_plain=True)}
    got = chain.step(weights, hidden, False, configs, join=True).float()
    assert (got - want).abs().max().item() < 2e-2 * want.abs().max().item()


def test_each_variant_is_the_base_with_the_joined_launch():
    from bench.decode_chain_qkv import (AFTER, BASE, CONFIGS, INT8_BASE, INT8_CONFIGS,
                                        QkvAttentionO, QkvRows, qkv_variants)
    base = (True, {"qkv": (2, 16, 4, 32), "o": (2, 16, 4, 32), "attention_o": "library"},
            None, True)
    found = qkv_variants({BASE: base, INT8_BASE: base})
    assert len(found) == len(CONFIGS) + 1 + len(INT8_CONFIGS)
    assert len(qkv_variants({BASE: base})) == len(CONFIGS) + 1
    every = {**CONFIGS, **INT8_CONFIGS}
    for name, (pdl, configs, ahead, join) in found.items():
        assert pdl and join and ahead is None and "," not in name
        assert name.startswith("dependent + join + qkv-attention-o ")
        assert isinstance(configs["qkv"], QkvRows) and configs["o"] == base[1]["o"]
        assert configs["qkv"].config == base[1]["qkv"]  # plain launches: the base's
        assert isinstance(configs["attention_o"], QkvAttentionO)
        joined, own = configs["attention_o"], name[len("dependent + join + "):]
        first = next(iter(CONFIGS.values()))  # AFTER: the first without the prefetch
        assert joined.config == (first if own == AFTER else every[own])
        assert joined.cache_ahead == (own != AFTER)
