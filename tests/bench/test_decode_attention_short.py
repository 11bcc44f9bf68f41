"""The decode attention of few, long blocks (bench/decode_attention_short.py): the
reference math for every split (one block a key/value head: no partial results, no
count), the counts left at zero, and the chain with it computing what the chain
computes, also replayed as a CUDA graph of dependent launches. On a GPU, or on the CPU
under ``TRITON_INTERPRET=1``."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels import reference
from tests.bench.test_decode_chain_split import _small_chain
from tests.helpers import triton_device

pytest.importorskip("triton")


def _inputs(shape, dtype, device, seed):
    heads, kv_heads, slots, dim = shape
    generator = torch.Generator().manual_seed(seed)

    def made(*size):
        return torch.randn(size, generator=generator).to(device=device, dtype=dtype)
    q = made(1, heads, 1, dim)
    past_k, past_v = made(1, kv_heads, slots, dim), made(1, kv_heads, slots, dim)
    new_k, new_v = made(1, kv_heads, 1, dim), made(1, kv_heads, 1, dim)
    mask = torch.zeros(1, 1, 1, slots + 1, device=device, dtype=dtype)
    mask[..., slots // 2:slots] = torch.finfo(dtype).min  # slots not yet written
    return q, past_k, new_k, past_v, new_v, mask


@pytest.mark.parametrize("shape, splits, dtype", [  # (H, KVH, S, D): groups of 8, 4, 1
    ((32, 4, 64, 64), 1, torch.float16), ((32, 4, 64, 64), 4, torch.float16),
    ((8, 2, 100, 80), 1, torch.float32), ((8, 2, 100, 80), 2, torch.float16),
    ((8, 2, 100, 80), 16, torch.float32), ((4, 4, 17, 16), 1, torch.float16),
    ((4, 4, 17, 16), 4, torch.float32)])
def test_short_attention_matches_its_reference_and_leaves_the_counts_at_zero(
        shape, splits, dtype):
    from bench.decode_attention_short import launch_short_attention
    device = triton_device()
    counts = torch.zeros(shape[1] + 2, device=device, dtype=torch.int32)
    bound = 2e-3 if dtype == torch.float16 else 1e-5
    for seed in (0, 1):  # one counts buffer for both calls
        args = _inputs(shape, dtype, device, seed)
        want = reference.decode_attention(*args, shape[-1] ** -0.5).float()
        got = launch_short_attention(*args, counts, splits=splits, warps=4)
        assert got.dtype == dtype and got.shape == want.shape
        assert ((got.float() - want).norm() / want.norm()).item() < bound
        assert not counts.any()


def test_a_fully_masked_block_adds_nothing():
    """Blocks wholly past the cache or masked (a short cache over many splits) weigh
    nothing: as the reference, no NaN."""
    from bench.decode_attention_short import launch_short_attention
    device = triton_device()
    args = _inputs((8, 2, 20, 32), torch.float16, device, 3)
    args[-1][..., :16] = torch.finfo(torch.float16).min
    counts = torch.zeros(2, device=device, dtype=torch.int32)
    want = reference.decode_attention(*args, 32 ** -0.5).float()
    got = launch_short_attention(*args, counts, splits=4, warps=4).float()
    assert not got.isnan().any()
    assert ((got - want).norm() / want.norm()).item() < 2e-3


def test_the_chain_with_short_attention_computes_what_the_chain_computes(monkeypatch):
    """Two layers' joins on the chain's one counts buffer (the interpreter has no
    dependent launches: plain ones there)."""
    from bench.decode_attention_short import ShortAttention
    device = triton_device()
    if device == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("dependent launches: Hopper and later")
    chain, weights, hidden = _small_chain(monkeypatch, device, slots=64)
    want = chain.step(weights, hidden, False, {}, join=True).float()
    configs = {"attention": ShortAttention(4, 4, own_plain=True)}
    got = chain.step(weights, hidden, device == "cuda", configs, join=True).float()
    assert (got - want).abs().max().item() < 2e-2 * want.abs().max().item()
    assert not weights["counts"].any()


def test_each_variant_is_the_join_chain_with_its_own_attention():
    from bench.decode_attention_short import CHANGES, ShortAttention, short_variants
    default = {"qkv": (2, 16, 4, 32)}
    found = short_variants(default)
    assert len(found) == len(CHANGES)
    for name, (pdl, configs, ahead, join) in found.items():
        assert pdl and join and ahead is None and name.startswith("dependent + join + ")
        assert configs["qkv"] == default["qkv"]
        assert isinstance(configs["attention"], ShortAttention)
        assert (configs["attention"].splits, configs["attention"].warps,
                configs["attention"].sem) == CHANGES[name[len("dependent + join + "):]]


@pytest.mark.cuda
@pytest.mark.parametrize("splits, warps", [(1, 8), (1, 16), (4, 4), (16, 4)])
def test_short_attention_replays_in_a_cuda_graph_of_dependent_launches(splits, warps):
    """Three dependent launches in a row at the ~1.1B's attention shape (32 heads over
    4, 64 wide, 512 slots) sharing one counts buffer, captured and replayed: the
    reference each replay, the counts at zero."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a Hopper GPU")
    from bench.decode_attention_short import launch_short_attention
    args = _inputs((32, 4, 512, 64), torch.float16, "cuda", 5)
    counts = torch.zeros(4, device="cuda", dtype=torch.int32)
    want = reference.decode_attention(*args, 0.125).float()
    launch_short_attention(*args, counts, splits, warps, pdl=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [launch_short_attention(*args, counts, splits, warps, pdl=True)
                for _ in range(3)]
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        for out in outs:
            assert ((out.float() - want).norm() / want.norm()).item() < 2e-3
        assert not counts.any()


@pytest.mark.cuda
@pytest.mark.parametrize("splits, warps", [(1, 8), (4, 4)])
def test_a_short_attention_chain_replays_in_a_cuda_graph(monkeypatch, splits, warps):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a Hopper GPU")
    from bench.decode_attention_short import ShortAttention
    chain, weights, hidden = _small_chain(monkeypatch, "cuda", layers=3, slots=64)
    want = chain.step(weights, hidden, False, {}, join=True).float()
    configs = {"attention": ShortAttention(splits, warps)}
    chain.step(weights, hidden, True, configs, join=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain.step(weights, hidden, True, configs, join=True)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert (out.float() - want).abs().max().item() < 2e-2 * want.abs().max().item()
        assert not weights["counts"].any()
