"""The decode chain's split-K variants (bench/decode_chain_split.py): a variant's split
product launched by the chain in place of the row kernel computes what the chain
computes, its counters shared by every layer and left at zero. A small chain on the CPU
under ``TRITON_INTERPRET=1`` (or on a GPU)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import triton_device

pytest.importorskip("triton")


def _small_chain(monkeypatch, device, layers=2, slots=8, int8=False):
    """decode_chain_cuda's chain at toy sizes: hidden 64, 4 heads of 16 over 2 key/value
    heads, 96 intermediate columns, 100 vocabulary rows (``int8``: the products' rows
    int8 with a scale a row, as ``--int8`` makes them)."""
    from bench import decode_chain_cuda as chain
    for name, value in dict(HIDDEN=64, KV=32, HEADS=4, KV_HEADS=2, DIM=16).items():
        monkeypatch.setattr(chain, name, value)
    generator = torch.Generator().manual_seed(21)

    def made(*size, scale=0.1):
        return (torch.randn(size, generator=generator) * scale).to(device, torch.float16)

    def w(rows, cols):
        if int8:
            return (torch.randint(-127, 128, (rows, cols), generator=generator,
                                  dtype=torch.int8).to(device),
                    made(rows, scale=0.0) + 1e-3)
        return made(rows, cols), None
    weights = {"layers": [{
        "qkv": w(128, 64), "o": w(64, 64), "gate_up": w(192, 64), "down": w(64, 96),
        "k": made(1, 2, slots, 16, scale=1.0), "v": made(1, 2, slots, 16, scale=1.0)}
        for _ in range(layers)], "head": w(100, 64),
        "norm": made(64, scale=0.1) + 1.0,
        "mask": torch.zeros(1, 1, 1, slots + 1, device=device, dtype=torch.float16),
        "counts": torch.zeros(2, device=device, dtype=torch.int32)}
    return chain, weights, made(1, 1, 64, scale=1.0)


@pytest.mark.parametrize("changes", [
    {"down": (4, 16, 4, 32, 2)}, {"down": (2, 32, 4, 64, 4)},
    {"o": (2, 16, 4, 16, 2), "down": (8, 32, 4, 32, 3)}])
def test_a_split_variant_computes_what_the_chain_computes(monkeypatch, changes):
    device = triton_device()
    from bench.decode_chain_split import SplitLaunch
    chain, weights, hidden = _small_chain(monkeypatch, device)
    want = chain.step(weights, hidden, False, {}, join=True).float()
    configs = {product: SplitLaunch(config) for product, config in changes.items()}
    for _ in range(2):  # the counters made once, shared by the layers, left at zero
        got = chain.step(weights, hidden, False, configs, join=True).float()
        assert (got - want).abs().max().item() < 2e-2 * want.abs().max().item()
        assert all(not launch.counts.any() for launch in configs.values())


@pytest.mark.parametrize("name", [
    "int8 row loop everywhere", "int8 row loop gate/up 4 rows 8 warps 4 turns",
    "int8 row loop down 1 row 4096 ahead 4 turns",
    "int8 split down 2 parts 4 rows whole part ahead",
    "int8 split o 2 parts 4 rows whole part ahead"])
def test_an_int8_variant_computes_what_the_int8_chain_computes(monkeypatch, name):
    """The ``--int8`` chain's variants with their own configurations (sized for the
    ~1.1B, masked down to toy rows here): int8 rows' scales in the row loop and the
    split join alike."""
    device = triton_device()
    from bench.decode_chain_rowloop import INT8_CHANGES
    from bench.decode_chain_split import CHANGES, SplitLaunch
    chain, weights, hidden = _small_chain(monkeypatch, device, int8=True)
    want = chain.step(weights, hidden, False, {}, join=True).float()
    changes = {**INT8_CHANGES, **CHANGES}[name]
    configs = {product: SplitLaunch(c) if len(c) == 5 else c for product, c in changes.items()}
    got = chain.step(weights, hidden, False, configs, join=True).float()
    assert (got - want).abs().max().item() < 2e-2 * want.abs().max().item()


def test_the_split_variants_name_split_launches_only_where_a_product_is_split():
    from bench.decode_chain_split import CHANGES, SplitLaunch, split_variants
    default = {"qkv": (2, 512, 8, 2048), "o": (2, 512, 8, 2048),
               "gate_up": (2, 512, 4, 2048, False, 5), "down": (4, 512, 4, 2048)}
    found = split_variants(default)
    assert len(found) == len(CHANGES)
    both = found["dependent + join + o 2 rows 4 warps + split down 2 parts 4 rows"]
    pdl, configs, cache_ahead, join = both
    assert pdl and join and cache_ahead is None
    assert configs["o"] == (2, 512, 4, 2048) and isinstance(configs["down"], SplitLaunch)
    assert configs["gate_up"] == default["gate_up"]
    assert repr(configs["down"]) == "split(4, 256, 4, 2048, 2)"


def test_a_split_launch_refuses_a_product_with_a_norm_or_a_gate():
    from bench.decode_chain_split import SplitLaunch
    with pytest.raises(ValueError, match="no norm"):
        SplitLaunch((4, 16, 4, 32, 2))(None, None, None, {"act": 1}, False)


def test_the_chain_gives_a_split_configuration_counters_as_a_library_does(monkeypatch):
    """A SPLIT configuration in the chain's own configs (gemv_config's choice for int8
    down in a library) runs split on the chain's counters, as the built step does."""
    device = triton_device()
    chain, weights, hidden = _small_chain(monkeypatch, device, int8=True)
    weights["split_counts"] = torch.zeros(64, device=device, dtype=torch.int32)
    want = chain.step(weights, hidden, False, {}, join=True).float()
    from targets.aoti.kernels import triton_kernels
    launched = []
    split_launch = triton_kernels.launch_split_gemv
    monkeypatch.setattr(triton_kernels, "launch_split_gemv",
                        lambda *a, **k: launched.append(a[4]) or split_launch(*a, **k))
    split = {"down": (4, 32, 4, 32, False, 0, 2), "o": (2, 16, 4, 16, False, 0, 4)}
    for _ in range(2):  # left at zero for the next layer and call
        got = chain.step(weights, hidden, False, split, join=True).float()
        assert (got - want).abs().max().item() < 2e-2 * want.abs().max().item()
        assert not weights["split_counts"].any()
    # o and down of both layers, both calls, on the chain's one buffer
    assert len(launched) == 8 and all(c is weights["split_counts"] for c in launched)
