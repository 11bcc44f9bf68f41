"""A layer's attention and o (+ residual) as one launch (bench/decode_attention_o*.py):
both forms against the float32 math (masked slots, the new row, the residual), their
counters and flags left as the next launch needs them over several calls on one set of
buffers, and the chain with them computing what the chain computes. On a GPU, or on the
CPU under ``TRITON_INTERPRET=1``."""

from __future__ import annotations

import pytest
import torch

from tests.bench.test_decode_chain_split import _small_chain
from tests.helpers import triton_device

pytest.importorskip("triton")


def _inputs(shape, rows, dtype, device, seed):
    """(q, past k, new k, past v, new v, mask with the last quarter of the past masked,
    Wo [rows, H * D], residual [1, 1, rows])."""
    heads, kv_heads, slots, dim = shape
    generator = torch.Generator().manual_seed(seed)

    def made(*size, scale=1.0):
        return (torch.randn(size, generator=generator) * scale).to(device=device, dtype=dtype)
    mask = torch.zeros(1, 1, 1, slots + 1, device=device, dtype=dtype)
    mask[..., slots * 3 // 4:slots] = torch.finfo(dtype).min  # slots not yet written
    return (made(1, heads, 1, dim), made(1, kv_heads, slots, dim), made(1, kv_heads, 1, dim),
            made(1, kv_heads, slots, dim), made(1, kv_heads, 1, dim), mask,
            made(rows, heads * dim, scale=0.1), made(1, 1, rows))


def _want(q, past_k, new_k, past_v, new_v, mask, weight, residual):
    """The attention and o in float32, nothing rounded between them."""
    heads, kv_heads, dim = q.shape[1], past_k.shape[1], q.shape[-1]
    keys = torch.cat([past_k, new_k], 2).float().repeat_interleave(heads // kv_heads, 1)
    values = torch.cat([past_v, new_v], 2).float().repeat_interleave(heads // kv_heads, 1)
    scores = q.float() @ keys.transpose(-1, -2) * dim ** -0.5 + mask.float()
    att = (torch.softmax(scores, -1) @ values).reshape(-1)
    return weight.float() @ att + residual.float().reshape(-1)


def _close(got, want, dtype):
    assert got.dtype == dtype
    bound = 3e-3 if dtype == torch.float16 else 1e-5
    assert ((got.float().reshape(-1) - want).norm() / want.norm()).item() < bound


# (H, KVH, S, D), o's rows: groups of 8, 2 and 4 query heads
SHAPES = [((16, 2, 40, 16), 48), ((4, 2, 33, 32), 20), ((8, 2, 64, 16), 64)]


@pytest.mark.parametrize("shape, rows", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("blocks, block_s", [(4, 16), (1, 32)])
def test_fused_matches_the_math_and_leaves_its_counters_at_zero(shape, rows, dtype,
                                                                   blocks, block_s):
    from bench.decode_attention_o_fused import fused_counters, launch_fused_attention_o
    device = triton_device()
    counts = fused_counters(8, device)
    for seed in (0, 1):  # one counters buffer for both calls
        args = _inputs(shape, rows, dtype, device, seed)
        got = launch_fused_attention_o(*args, counts, blocks, block_s, warps=4)
        assert got.shape == (1, 1, rows)
        _close(got, _want(*args), dtype)
        assert not counts.any()


@pytest.mark.parametrize("shape, rows", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("splits, block_n", [(4, 4), (1, 8)])
def test_joined_matches_the_math_and_hands_its_flags_on(shape, rows, dtype, splits,
                                                        block_n):
    """Three launches over slots 0, 1, 0: each counts every key/value head in on its
    slot and zeroes the next launch's."""
    from bench.decode_attention_o_flag import joined_state, launch_joined_attention_o
    from bench.flag_wait_triton import STRIDE
    device = triton_device()
    state = joined_state(shape[1], 2, device)
    for seed, (slot, reset) in enumerate([(0, 1), (1, 0), (0, 1)]):
        args = _inputs(shape, rows, dtype, device, seed)
        got = launch_joined_attention_o(*args, state, slot, reset, splits, block_n,
                                        warps=4, poll=0)
        assert got.shape == (1, 1, rows)
        # the attention's output is rounded to the query's dtype, as the chain's
        _close(got, _want(*args), dtype)
        flags = state["flags"].view(2, STRIDE)
        assert flags[slot, 0].item() == shape[1] and flags[reset, 0].item() == 0
        assert not state["counts"].any() and not state["err"].any()


@pytest.mark.parametrize("form", ["fused", "joined"])
def test_int8_rows_take_their_scale_a_row(form):
    from bench import decode_attention_o_flag as joined
    from bench import decode_attention_o_fused as fused
    device = triton_device()
    *args, weight, residual = _inputs((8, 2, 40, 16), 24, torch.float16, device, 4)
    generator = torch.Generator().manual_seed(5)
    rows = torch.randint(-127, 128, (24, 128), generator=generator, dtype=torch.int8)
    scale = (torch.rand(24, generator=generator) * 1e-2 + 1e-3).to(torch.float16)
    rows, scale = rows.to(device), scale.to(device)
    want = _want(*args, rows.float() * scale.float()[:, None], residual)
    if form == "fused":
        got = fused.launch_fused_attention_o(*args, rows, residual, fused.fused_counters(
            4, device), 2, 16, warps=4, weight_scale=scale)
    else:
        got = joined.launch_joined_attention_o(*args, rows, residual, joined.joined_state(
            2, 2, device), 0, 1, 2, 4, warps=4, poll=0, weight_scale=scale)
    _close(got, want, torch.float16)


@pytest.mark.parametrize("block_n, warps", [(4, 4), (2, 8)])
def test_joined_over_int4_rows_computes_their_weights(block_n, warps):
    """o's rows packed as int4 rows (groups of 32): what reference.int4_weight gives."""
    from bench.decode_attention_o import int4_steps
    from bench.decode_attention_o_flag import joined_state, launch_joined_attention_o
    from targets.aoti.kernels import int4_rows, reference
    device = triton_device()
    *args, weight, residual = _inputs((8, 2, 40, 16), 24, torch.float16, device, 6)
    packed, scales = int4_rows.pack(weight, 32)
    want = _want(*args, reference.int4_weight(packed, scales).float(), residual)
    got = launch_joined_attention_o(
        *args, packed, residual, joined_state(2, 2, device), 0, 1, 2, block_n, warps,
        poll=0, weight_scale=scales, int4=int4_steps(block_n, warps, 128, 4))
    _close(got, want, torch.float16)


def test_a_fully_masked_block_adds_nothing():
    from bench.decode_attention_o_fused import fused_counters, launch_fused_attention_o
    device = triton_device()
    args = _inputs((8, 2, 48, 16), 16, torch.float16, device, 3)
    args[5][..., :20] = torch.finfo(torch.float16).min
    got = launch_fused_attention_o(*args, fused_counters(4, device), 2, 16, warps=4)
    assert not got.isnan().any()
    _close(got, _want(*args), torch.float16)


@pytest.mark.parametrize("form, config", [("fused", (2, 16, 4, 2)),
                                          ("joined", (2, 4, 4, 0, 64))])
def test_the_chain_with_one_launch_computes_what_the_chain_computes(monkeypatch, form,
                                                                     config):
    """Three layers on one set of buffers, twice (the interpreter has no dependent
    launches: plain ones there)."""
    from bench.decode_attention_o import AttentionO
    device = triton_device()
    chain, weights, hidden = _small_chain(monkeypatch, device, layers=3, slots=24)
    want = chain.step(weights, hidden, False, {}, join=True).float()
    configs = {"attention_o": AttentionO(form, *config, own_plain=True)}
    for _ in range(2):
        got = chain.step(weights, hidden, False, configs, join=True).float()
        assert (got - want).abs().max().item() < 2e-2 * want.abs().max().item()
    state = configs["attention_o"].state
    assert not state["row_counts"].any() and not state["counts"].any()
    assert not state["err"].any()


def test_each_variant_is_the_join_chain_with_its_own_launch():
    from bench.decode_attention_o import CHANGES, AttentionO, attention_o_variants
    default = {"qkv": (2, 16, 4, 32)}
    found = attention_o_variants(default)
    assert len(found) == len(CHANGES)
    for name, (pdl, configs, ahead, join) in found.items():
        assert pdl and join and ahead is None and name.startswith("dependent + join + ")
        assert "," not in name  # --variants splits on commas
        assert configs["qkv"] == default["qkv"]
        both = configs["attention_o"]
        assert isinstance(both, AttentionO)
        assert (both.form, *both.config) == CHANGES[name[len("dependent + join + "):]]


def test_the_int4_variants_are_the_int4_join_chain_with_the_joined_form():
    from bench.decode_attention_o import INT4_CHANGES, attention_o_int4_variants
    base = {"o": "int4 launch"}
    found = attention_o_int4_variants({"int4 dependent + join": (True, base, None, True)})
    assert len(found) == len(INT4_CHANGES) > 0
    for name, (pdl, configs, ahead, join) in found.items():
        assert pdl and join and ahead is None and "," not in name
        assert name.startswith("int4 dependent + join + attention-o joined ")
        assert configs["o"] == "int4 launch" and configs["attention_o"].form == "joined"


def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a Hopper GPU")


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["attention-o fused 32 blocks 8 warps",
                                  "attention-o fused 16 blocks 8 warps",
                                  "attention-o joined 16 splits 2 rows",
                                  "attention-o joined 4 splits 2 rows"])
def test_a_chain_of_one_launches_replays_in_a_cuda_graph(monkeypatch, name):
    """The ~1.1B's attention shape (32 heads over 4, 64 wide, 512 slots, o 2048 rows),
    four layers of dependent launches captured and replayed: the plain chain's output
    each replay, the counters and flags as they should be."""
    _hopper()
    from bench.decode_attention_o import CHANGES, AttentionO
    from bench.decode_chain_cuda import step, weights
    torch.manual_seed(0)
    made = weights(4, 512)
    hidden = torch.randn(1, 1, 2048, device="cuda", dtype=torch.float16)
    want = step(made, hidden, False, {}, join=True).float()
    both = AttentionO(*CHANGES[name])
    configs = {"attention_o": both}
    step(made, hidden, True, configs, join=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(made, hidden, True, configs, join=True)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert (out.float() - want).abs().max().item() < 2e-2 * want.abs().max().item()
        assert not both.state["row_counts"].any() and not both.state["counts"].any()
        assert not both.state["err"].any()
