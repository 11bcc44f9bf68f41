"""bench/head_argmax_triton.py: the head's product with the greedy token taken inside it.
The token is torch.argmax of the logits the kernel returns (ties: the first; negative
logits; NaN: the first NaN, as torch), the logits are row_gemv's, and the state buffer
is back at its start after every call. On the CPU under ``TRITON_INTERPRET=1`` (its
atomics run one program at a time) or on a GPU."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import triton_device

triton = pytest.importorskip("triton")
tl = triton.language

from bench.head_argmax_triton import _keys  # noqa: E402

HIDDEN = 64
CONFIG = (8, 32, 4, 16)  # 8 rows a program; 201 rows: the last block part-filled


def _head(device, rows=201, dtype=torch.float16, seed=5):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 1, HIDDEN, generator=generator).to(device, dtype)
    w = (torch.randn(rows, HIDDEN, generator=generator) * 0.1).to(device, dtype)
    norm = (torch.rand(HIDDEN, generator=generator) + 0.5).to(device, dtype)
    return x, w, norm


def _token(x, w, norm, state, position=None):
    from bench.head_argmax_triton import launch_head_argmax
    token = torch.full((1,), -1, dtype=torch.int64, device=x.device)
    logits = launch_head_argmax(x, w, norm, 1e-5, 0.0, state, token, CONFIG,
                                position=position)
    return logits, int(token)


@triton.jit
def keys_of(y_ptr, out_ptr, N: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.arange(0, BLOCK)
    ok = rows < N
    y = tl.load(y_ptr + rows, mask=ok, other=0.0)
    tl.store(out_ptr + rows, _keys(y, rows, ok), mask=ok)


def _start(device):
    from bench.head_argmax_triton import argmax_state
    return argmax_state(device)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_the_token_is_the_argmax_of_the_logits_it_returns(dtype):
    from targets.aoti.kernels.reference import row_gemv
    device = triton_device()
    x, w, norm = _head(device, dtype=dtype)
    state = _start(device)
    logits, token = _token(x, w, norm, state)
    want = row_gemv(x, w, None, norm, None, 1e-5, 0.0, 0)
    assert (logits.float() - want.float()).abs().max().item() < 1e-2
    assert token == int(logits.reshape(-1).argmax())
    assert state.tolist() == _start(device).tolist()


def test_equal_maxima_give_the_first_in_another_block_and_in_the_same():
    device = triton_device()
    x, w, norm = _head(device)
    top = int(_token(x, w, norm, _start(device))[0].reshape(-1).argmax())
    for copy in {top - 1 if top % 8 else top + 1, (top + 100) % 201}:  # same block; another
        tied = w.clone()
        tied[copy] = w[top]
        logits, token = _token(x, tied, norm, _start(device))
        assert token == min(top, copy) == int(logits.reshape(-1).argmax())


def test_negative_and_all_equal_logits():
    device = triton_device()
    x, w, norm = _head(device)
    x = x.abs()
    negative = -w.abs() - 0.01  # every logit below zero: the order-preserving map
    negative[177] *= 0.1  # the largest: nearest zero
    logits, token = _token(x, negative, norm, _start(device))
    assert logits.max().item() < 0
    assert token == int(logits.reshape(-1).argmax()) == 177
    same = w[:1].expand(201, HIDDEN).contiguous()
    assert _token(x, same, norm, _start(device))[1] == 0
    zeros = torch.zeros_like(w)
    assert _token(x, zeros, norm, _start(device))[1] == 0


def test_a_nan_logit_is_the_max_as_torch_takes_it():
    device = triton_device()
    x, w, norm = _head(device)
    w[120, 3] = float("nan")
    w[180, 0] = float("nan")
    logits, token = _token(x, w, norm, _start(device))
    assert token == int(logits.reshape(-1).argmax()) == 120


def test_one_buffer_serves_several_calls_and_is_back_at_its_start_after_each():
    device = triton_device()
    state = _start(device)
    position = torch.zeros(1, dtype=torch.int64, device=device)
    for seed in range(3):
        x, w, norm = _head(device, seed=seed)
        logits, token = _token(x, w, norm, state, position)
        assert token == int(logits.reshape(-1).argmax())
        assert state.tolist() == _start(device).tolist()
        assert int(position) == seed + 1


def test_a_bad_state_or_token_buffer_is_refused():
    from bench.head_argmax_triton import launch_head_argmax
    device = triton_device()
    x, w, norm = _head(device)
    token = torch.zeros(1, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="state"):
        launch_head_argmax(x, w, norm, 1e-5, 0.0, torch.zeros(2, dtype=torch.int32,
                                                                 device=device), token)
    with pytest.raises(ValueError, match="token"):
        launch_head_argmax(x, w, norm, 1e-5, 0.0, _start(device), token.int())


def test_the_keys_order_logits_as_torch_compares_them():
    """The map alone, on values a product rarely gives: infinities, a subnormal, -0.0
    (equal to +0.0) and NaNs of both signs (every NaN the largest: torch.argmax takes
    the first NaN)."""
    device = triton_device()
    values = [float("-inf"), -3e38, -1.0, -1e-40, -0.0, 0.0, 1e-40, 1.0, 3e38,
              float("inf"), float("nan"), -float("nan")]
    y = torch.tensor(values, dtype=torch.float32, device=device)
    keys = torch.empty(len(values), dtype=torch.int64, device=device)
    keys_of[(1,)](y, keys, N=len(values), BLOCK=16)
    high = (keys >> 32).tolist()
    assert all(a < b for a, b in zip(high[:4], high[1:5]))  # -inf .. -0.0
    assert high[4] == high[5]  # -0.0 == +0.0
    assert all(a < b for a, b in zip(high[5:9], high[6:10]))  # +0.0 .. inf
    assert high[10] == high[11] > high[9]  # NaN of either sign above inf
    assert keys[4] > keys[5] and keys[10] > keys[11]  # equal: the first index larger


def test_the_chain_ending_with_the_token_computes_what_the_chain_computes(monkeypatch):
    """decode_chain_cuda's small chain with argmax_variants' heads (torch's tail; the
    kernel advancing the position): the same logits, the token checked against
    torch.argmax inside the call, the position advanced once a call."""
    from bench.head_argmax_triton import HeadArgmax
    from tests.bench.test_decode_chain_split import _small_chain
    device = triton_device()
    chain, weights, hidden = _small_chain(monkeypatch, device, layers=1)
    want = chain.step(weights, hidden, False, {}, join=True).float()
    for head, calls in ((HeadArgmax(CONFIG, False), 1), (HeadArgmax(CONFIG, True, True), 2)):
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
        "torch argmax", "head argmax", "head argmax and position")}
    for pdl, configs, cache_ahead, join in found.values():
        assert pdl and join and cache_ahead is None and configs["qkv"] == default["qkv"]
        assert isinstance(configs["head"], HeadArgmax)
        assert configs["head"].config == default["head"]


@pytest.mark.cuda
def test_dependent_heads_in_a_row_share_one_state_in_a_cuda_graph():
    """Three dependent launches at the ~1.1B's head shape (32,000 x 2,048, norm folded),
    one state and one position, captured and replayed: a head starts while the one
    before drains, and merges only after its wait, so each token is its own logits'."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a Hopper GPU")
    from bench.head_argmax_triton import argmax_state, launch_head_argmax
    torch.manual_seed(3)
    w = torch.randn(32000, 2048, device="cuda", dtype=torch.float16) * 0.02
    norm = torch.rand(2048, device="cuda", dtype=torch.float16) + 0.5
    xs = [torch.randn(1, 1, 2048, device="cuda", dtype=torch.float16) for _ in range(3)]
    state, position = argmax_state("cuda"), torch.zeros(1, dtype=torch.int64, device="cuda")
    tokens = [torch.zeros(1, dtype=torch.int64, device="cuda") for _ in xs]

    def heads():
        return [launch_head_argmax(x, w, norm, 1e-5, 0.0, state, token, pdl=True,
                                   position=position) for x, token in zip(xs, tokens)]
    heads()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = heads()
    for replay in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert [int(t) for t in tokens] == [int(o.reshape(-1).argmax()) for o in outs]
        assert state.tolist() == argmax_state("cuda").tolist()
        assert int(position) == 3 * (replay + 2)
