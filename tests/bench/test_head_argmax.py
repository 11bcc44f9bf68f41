"""bench/head_argmax_triton.py: the decode chain's heads ending with the token (the
library's kernel, targets/aoti/kernels/head_argmax_triton.py, tested beside it). On the
CPU under ``TRITON_INTERPRET=1`` or on a GPU."""

from __future__ import annotations

import pytest

from tests.helpers import triton_device

triton = pytest.importorskip("triton")

CONFIG = (8, 32, 4, 16)  # 8 rows a program


def test_the_chain_ending_with_the_token_computes_what_the_chain_computes(monkeypatch):
    """decode_chain_cuda's small chain with argmax_variants' heads (torch's tail; the
    library's head, twice on its one slot): the same logits, the token checked against
    torch.argmax inside the call, the position advanced once a call."""
    from bench.head_argmax_triton import HeadArgmax
    from tests.bench.test_decode_chain_split import _small_chain
    device = triton_device()
    chain, weights, hidden = _small_chain(monkeypatch, device, layers=1)
    want = chain.step(weights, hidden, False, {}, join=True).float()
    for head, calls in ((HeadArgmax(CONFIG, False), 1), (HeadArgmax(CONFIG, True), 2)):
        for call in range(calls):
            got = chain.step(weights, hidden, False, {"head": head}, join=True).float()
            assert (got - want).abs().max().item() < 1e-2 * want.abs().max().item()
            assert int(head.token) == int(want.reshape(-1).argmax())
            assert int(head.position) == call + 1


def test_the_argmax_variants_end_dependent_join_with_each_tail():
    from bench.head_argmax_triton import HeadArgmax, argmax_variants
    default = {"qkv": (2, 512, 8, 2048), "head": (8, 256, 4, 1024)}
    found = argmax_variants(default)
    assert set(found) == {f"dependent + join + {tail}" for tail in (
        "torch argmax", "head argmax")}
    for pdl, configs, cache_ahead, join in found.values():
        assert pdl and join and cache_ahead is None and configs["qkv"] == default["qkv"]
        assert isinstance(configs["head"], HeadArgmax)
        assert configs["head"].config == default["head"]
