"""The chain's attention + o variants (bench/decode_attention_o.py): the library's launch
(its math: tests/targets/aoti/test_decode_attention_o*.py) at each variant's
configuration computes what the chain computes, its counts and flags left as the next
launch needs them. On a GPU, or on the CPU under ``TRITON_INTERPRET=1``."""

from __future__ import annotations

import pytest
import torch

from tests.bench.test_decode_chain_split import _small_chain
from tests.helpers import triton_device

pytest.importorskip("triton")


@pytest.mark.parametrize("config, store", [((2, 4, 4), False), ((4, 8, 8), True)])
def test_the_chain_with_one_launch_computes_what_the_chain_computes(monkeypatch, config,
                                                                     store):
    """Three layers on one set of buffers, twice (the interpreter has no dependent
    launches: plain ones there); the store form writes the last slot, masked."""
    from bench.decode_attention_o import AttentionO
    device = triton_device()
    chain, weights, hidden = _small_chain(monkeypatch, device, layers=3, slots=24)
    weights["mask"][..., 23] = torch.finfo(torch.float16).min
    want = chain.step(weights, hidden, False, {}, join=True).float()
    last = [layer["k"][..., 23, :].clone() for layer in weights["layers"]]
    both = AttentionO(*config, store=store, own_plain=True)
    for _ in range(2):
        got = chain.step(weights, hidden, False, {"attention_o": both}, join=True).float()
        assert (got - want).abs().max().item() < 2e-2 * want.abs().max().item()
    assert not both.state["counts"].any()
    # flag_slots(3): each layer counts its 2 key/value heads in, the last zeroes slot 0
    assert both.state["flags"].view(3, -1)[:, 0].tolist() == [0, 2, 2]
    written = [not torch.equal(before, layer["k"][..., 23, :])
               for before, layer in zip(last, weights["layers"])]
    assert written == [store] * 3


def test_the_chain_with_int8_rows_computes_what_it_computes(monkeypatch):
    from bench.decode_attention_o import AttentionO
    device = triton_device()
    chain, weights, hidden = _small_chain(monkeypatch, device, layers=1, slots=16,
                                          int8=True)
    want = chain.step(weights, hidden, False, {}, join=True).float()
    configs = {"attention_o": AttentionO(8, 4, 4, own_plain=True)}
    got = chain.step(weights, hidden, False, configs, join=True).float()
    assert (got - want).abs().max().item() < 2e-2 * want.abs().max().item()


def test_each_variant_is_the_join_chain_with_the_library_launch():
    from bench.decode_attention_o import BASES, CHANGES, AttentionO, attention_o_variants
    default = {"qkv": (2, 16, 4, 32)}
    found = attention_o_variants(default)
    assert len(found) == len(CHANGES) + 2 * len(BASES)
    for base in BASES:  # the chain's bases, and the base again
        assert f"dependent + join + {base}" in found
        assert f"dependent + join + {base} + nothing changed" in found
    for name, (pdl, configs, ahead, join) in found.items():
        assert pdl and join and ahead is None and name.startswith("dependent + join + ")
        assert "," not in name  # --variants splits on commas
        assert configs["qkv"] == default["qkv"]
        both = configs["attention_o"]
        assert isinstance(both, AttentionO)
        change = name[len("dependent + join + "):].split(" + ")[0]
        assert both.config == CHANGES[change] and both.store == name.endswith("stored")
    launches = [configs["attention_o"] for _, configs, *_ in found.values()]
    assert len({id(launch) for launch in launches}) == len(launches)  # buffers their own


def test_the_int4_variants_are_the_int4_join_chain_with_the_library_launch():
    from bench.decode_attention_o import CHANGES, attention_o_int4_variants
    base = {"o": "int4 launch"}
    found = attention_o_int4_variants({"int4 dependent + join": (True, base, None, True)})
    assert len(found) == len(CHANGES) + 2
    assert "int4 dependent + join + attention-o joined 4 splits 4 rows + nothing changed" \
        in found
    for name, (pdl, configs, ahead, join) in found.items():
        assert pdl and join and ahead is None and "," not in name
        assert name.startswith("int4 dependent + join + attention-o joined ")
        assert configs["o"] == "int4 launch"


def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a Hopper GPU")


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["attention-o joined 4 splits 4 rows",
                                  "attention-o joined 4 splits 4 rows + K/V rows stored",
                                  "attention-o joined 16 splits 8 rows 8 warps"])
def test_a_chain_of_one_launches_replays_in_a_cuda_graph(monkeypatch, name):
    """The ~1.1B's attention shape (32 heads over 4, 64 wide, 512 slots, o 2048 rows),
    four layers of dependent launches captured and replayed: the plain chain's output
    each replay, the counts at zero."""
    _hopper()
    from bench.decode_attention_o import attention_o_variants
    from bench.decode_chain_cuda import step, weights
    torch.manual_seed(0)
    made = weights(4, 512)
    hidden = torch.randn(1, 1, 2048, device="cuda", dtype=torch.float16)
    want = step(made, hidden, False, {}, join=True).float()
    configs = attention_o_variants({})[f"dependent + join + {name}"][1]
    step(made, hidden, True, configs, join=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(made, hidden, True, configs, join=True)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert (out.float() - want).abs().max().item() < 2e-2 * want.abs().max().item()
        assert not configs["attention_o"].state["counts"].any()
