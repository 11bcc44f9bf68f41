"""The decode chain's flag waits (bench/flag_wait_triton.py, bench/decode_chain_flag.py):
a chain whose kernels wait on the kernel before's count instead of gdc_wait computes
what the chain computes, and leaves its slots as the next step needs them (zero, but
the one the head spun on, which the next step's first launch zeroes). Under
``TRITON_INTERPRET=1`` (programs one after the other, POLL 0) or on a Hopper GPU."""

from __future__ import annotations

import pytest
import torch

from tests.bench.test_decode_chain_split import _small_chain
from tests.helpers import triton_device

pytest.importorskip("triton")

# the toy chain's products (hidden 64): (BLOCK_N, BLOCK_K, warps, AHEAD[, TILE_X, TURNS])
TOY = {"qkv": (2, 16, 4, 32), "o": (2, 16, 4, 32), "gate_up": (2, 32, 4, 64, False, 2),
       "down": (2, 32, 4, 32), "head": (4, 32, 4, 64)}


def _left_as_the_next_step_needs(configs) -> None:
    from bench.flag_wait_triton import SLOT_SUBS, STRIDE
    chain = configs["qkv"].chain
    counters = chain.flags.view(-1, STRIDE)[:, 0].cpu()
    assert counters[0] == 0  # no program gave up
    if chain.last_wait is not None:  # the head's: zeroed by the next step's first launch
        counters[chain.last_wait * SLOT_SUBS:(chain.last_wait + 1) * SLOT_SUBS] = 0
    assert not counters.any()


@pytest.mark.parametrize("flagged, subs", [((), 1), (("qkv>attention", "o>gate_up"), 1),
                                           ("all", 1), ("all", 4)])
def test_a_flag_chain_computes_what_the_chain_computes(monkeypatch, flagged, subs):
    from bench.decode_chain_flag import BOUNDARIES, flag_configs
    device = triton_device()
    if device == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("flag waits are dependent launches: Hopper and later")
    chain, weights, hidden = _small_chain(monkeypatch, device)
    configs = flag_configs(TOY, BOUNDARIES if flagged == "all" else flagged,
                           poll=0 if device == "cpu" else 1, subs=subs)
    if device == "cpu":  # the interpreter's spin: every thread, every counter
        configs["qkv"].chain.poll = 0
    # plain launches (the bench's check) are the library's kernels
    want = chain.step(weights, hidden, False, configs, join=True).float()
    assert torch.equal(want, chain.step(weights, hidden, False, TOY, join=True).float())
    for _ in range(2):  # the second step resets what the first left
        got = chain.step(weights, hidden, True, configs, join=True).float()
        assert (got - want).abs().max().item() < 1e-2 * want.abs().max().item()
        _left_as_the_next_step_needs(configs)
        assert not weights["counts"].any()  # the attention's join left at zero


def test_each_flag_variant_shares_one_chain_between_its_places():
    from bench.decode_chain_flag import CHANGES, FlagLaunch, flag_variants
    variants = flag_variants(TOY)
    assert len(variants) == len(CHANGES)
    chains = set()
    for name, (pdl, configs, ahead, join) in variants.items():
        assert pdl and join and ahead is None
        assert set(configs) == {*TOY, "attention"}
        assert all(isinstance(c, FlagLaunch) for c in configs.values())
        assert len({id(c.chain) for c in configs.values()}) == 1
        chains.add(id(configs["qkv"].chain))
    assert len(chains) == len(variants)


@pytest.mark.cuda
@pytest.mark.parametrize("poll, subs", [(1, 1), (32, 1), (1 << 16, 1), (8, 8), (32, 32)])
def test_a_flag_chain_replays_in_a_cuda_graph(monkeypatch, poll, subs):
    """Dependent launches that spin on flags, captured and replayed: the same output each
    replay, no program gave up, the slots left as the next replay needs them."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a Hopper GPU")
    from bench.decode_chain_flag import BOUNDARIES, flag_configs
    chain, weights, hidden = _small_chain(monkeypatch, "cuda", layers=3, slots=64)
    want = chain.step(weights, hidden, False, {}, join=True).float()
    configs = flag_configs(TOY, BOUNDARIES, poll=poll, subs=subs)
    chain.step(weights, hidden, True, configs, join=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain.step(weights, hidden, True, configs, join=True)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert (out.float() - want).abs().max().item() < 2e-2 * want.abs().max().item()
        _left_as_the_next_step_needs(configs)


@pytest.mark.cuda
def test_a_count_never_reached_gives_up_and_is_counted():
    """A wait that would hang (no kernel before counts in) gives up after LIMIT polls and
    counts itself on the error slot: a bug shows there, the GPU is not hung."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a Hopper GPU")
    from bench.flag_wait_triton import row_gemv_flag_kernel
    flags = torch.zeros(64, dtype=torch.int32, device="cuda")
    x = torch.ones(64, dtype=torch.float16, device="cuda")
    w = torch.ones(4, 64, dtype=torch.float16, device="cuda")
    out = torch.empty(4, dtype=torch.float16, device="cuda")
    row_gemv_flag_kernel[(2,)](x, w, w, w, out, flags[32:], flags, flags[32:], flags,
                               EPS=1e-5, N=4, K=64, HAS_NORM=False, HAS_RES=False,
                               BLOCK_N=2, BLOCK_K=32, AHEAD=32, WAIT_FLAG=True, RESET=False,
                               ARRIVE=False, TARGET=1, POLL=1, NS=32, num_warps=4)
    torch.cuda.synchronize()
    assert int(flags[0]) == 2  # one poller a program gave up
    assert torch.equal(out, torch.full_like(out, 64.0))
