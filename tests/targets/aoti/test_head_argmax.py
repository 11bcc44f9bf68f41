"""targets/aoti/kernels/head_argmax_triton.py (the row_gemv_argmax op's kernels): the
head's product with the greedy token taken inside it. The token is torch.argmax of the
logits the kernel returns (ties: the first; negative logits; NaN: the first NaN, as
torch), the logits are row_gemv's, and the slot is back at zero after every call; ties,
the CUDA graph of dependent heads and the library over float and int4 rows
(weight_rows.py; int4-only checks: test_head_argmax_int4.py). On the CPU under
``TRITON_INTERPRET=1`` (its atomics run one program at a time) or on a GPU; the CUDA
graph and the library on a Hopper GPU only (marked cuda)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import triton_device

triton = pytest.importorskip("triton")
tl = triton.language

from targets.aoti.kernels import reference  # noqa: E402
from targets.aoti.kernels.head_argmax_triton import _keys  # noqa: E402
from tests.targets.aoti.aoti_library import compile_library, load_library  # noqa: E402
from tests.targets.aoti.weight_rows import rows_of  # noqa: E402

HIDDEN = 64
CONFIG = (8, 32, 4, 16)  # 8 rows a program; 201 rows: the last block part-filled
# each width's columns and config (int4_config's: 8 rows a program too)
SHAPES = {"float": (HIDDEN, CONFIG), "int4": (256, (8, 2, 4, False))}


def _head(device, rows=201, cols=HIDDEN, dtype=torch.float16, seed=5):
    """x, the head's float rows and a norm weight (test_head_argmax_int4.py packs the
    rows it makes here)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 1, cols, generator=generator).to(device, dtype)
    w = (torch.randn(rows, cols, generator=generator) * 0.1).to(device, dtype)
    norm = (torch.rand(cols, generator=generator) + 0.5).to(device, dtype)
    return x, w, norm


def _token(x, w, norm, slot, scale=None, config=CONFIG):
    from targets.aoti.kernels.head_argmax_triton import launch_head_argmax
    token = torch.full((1,), -1, dtype=torch.int64, device=x.device)
    logits, given = launch_head_argmax(x, w, None, norm, 1e-5, 0.0, scale, config,
                                       slot=slot, token=token)
    assert given is token
    return logits, int(token)


@triton.jit
def keys_of(y_ptr, out_ptr, N: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.arange(0, BLOCK)
    ok = rows < N
    y = tl.load(y_ptr + rows, mask=ok, other=0.0)
    tl.store(out_ptr + rows, _keys(y, rows, ok), mask=ok)


def _start(device):
    from targets.aoti.kernels.head_argmax_triton import argmax_slot
    return argmax_slot(device)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_the_token_is_the_argmax_of_the_logits_it_returns(dtype):
    device = triton_device()
    x, w, norm = _head(device, dtype=dtype)
    slot = _start(device)
    logits, token = _token(x, w, norm, slot)
    want = reference.row_gemv(x, w, None, norm, None, 1e-5, 0.0, 0)
    assert (logits.float() - want.float()).abs().max().item() < 1e-2
    assert token == int(logits.reshape(-1).argmax())
    assert slot.tolist() == [0]


@pytest.mark.parametrize("width", SHAPES)
def test_equal_maxima_give_the_first_in_another_block_and_in_the_same(width):
    """Of two equal rows (int4: equal before packing), the first index."""
    device = triton_device()
    cols, config = SHAPES[width]
    x, w, norm = _head(device, cols=cols)

    def token_of(float_rows):
        weight, scale = rows_of(float_rows, width, x.dtype, device)
        return _token(x, weight, norm, _start(device), scale, config)
    top = int(token_of(w)[0].reshape(-1).argmax())
    for copy in {top - 1 if top % 8 else top + 1, (top + 100) % 201}:  # same block; another
        tied = w.clone()
        tied[copy] = w[top]
        logits, token = token_of(tied)
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


def test_one_slot_serves_several_calls_and_is_back_at_zero_after_each():
    device = triton_device()
    slot = _start(device)
    for seed in range(3):
        x, w, norm = _head(device, seed=seed)
        logits, token = _token(x, w, norm, slot)
        assert token == int(logits.reshape(-1).argmax())
        assert slot.tolist() == [0]


def test_a_bad_slot_or_token_buffer_is_refused():
    from targets.aoti.kernels.head_argmax_triton import launch_head_argmax
    device = triton_device()
    x, w, norm = _head(device)
    token = torch.zeros(1, dtype=torch.int64, device=device)
    bad = torch.zeros(2, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="slot"):
        launch_head_argmax(x, w, None, norm, 1e-5, 0.0, None, slot=bad, token=token)
    with pytest.raises(ValueError, match="token"):
        launch_head_argmax(x, w, None, norm, 1e-5, 0.0, None, token=token.int())


def test_int8_rows_with_their_scales_and_a_bias():
    """The op's other products (an int8 head, a biased one) as row_gemv computes them."""
    device = triton_device()
    x, w, norm = _head(device)
    q, scale = rows_of(w, "int8", w.dtype, device)
    bias = torch.linspace(-0.5, 0.5, w.shape[0]).to(device, w.dtype)
    from targets.aoti.kernels.head_argmax_triton import launch_head_argmax
    logits, token = launch_head_argmax(x, q, bias, norm, 1e-5, 0.0, scale, CONFIG)
    want, _ = reference.row_gemv_argmax(x, q, bias, norm, 1e-5, 0.0, scale)
    assert (logits.float() - want.float()).abs().max().item() < 1e-2
    assert int(token) == int(logits.reshape(-1).argmax())


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
    assert (keys > 0).all()  # every key above the slot's start
    high = (keys >> 31).tolist()
    assert all(a < b for a, b in zip(high[:4], high[1:5]))  # -inf .. -0.0
    assert high[4] == high[5]  # -0.0 == +0.0
    assert all(a < b for a, b in zip(high[5:9], high[6:10]))  # +0.0 .. inf
    assert high[10] == high[11] > high[9]  # NaN of either sign above inf
    assert keys[4] > keys[5] and keys[10] > keys[11]  # equal: the first index larger


def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("dependent launches need a Hopper GPU")


@pytest.mark.cuda
@pytest.mark.parametrize("width", ["float", "int4"])
def test_dependent_heads_in_a_row_share_one_slot_in_a_cuda_graph(width):
    """Three dependent launches at the ~1.1B's head shape (32,000 x 2,048, norm folded;
    int4 rows in groups of 128), each with its token kernel, one slot, captured and
    replayed: a head starts while the token kernel before it drains and merges only
    after its wait, the token kernel waits for its head, so each token is its own
    logits', and the logits are the reference's."""
    _hopper()
    from targets.aoti.kernels.head_argmax_triton import argmax_slot, launch_head_argmax
    x, w, norm = _head("cuda", rows=32000, cols=2048, seed=3)
    weight, scale = rows_of(w, width, torch.float16, "cuda")
    xs = [x.roll(i, dims=-1).contiguous() for i in range(3)]
    slot = argmax_slot("cuda")
    tokens = [torch.zeros(1, dtype=torch.int64, device="cuda") for _ in xs]

    def heads():
        return [launch_head_argmax(each, weight, None, norm, 1e-5, 0.0, scale, pdl=True,
                                   slot=slot, token=token)[0]
                for each, token in zip(xs, tokens)]
    heads()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = heads()
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert [int(t) for t in tokens] == [int(o.reshape(-1).argmax()) for o in outs]
        assert slot.tolist() == [0]
    want = reference.row_gemv(xs[0], weight, None, norm, None, 1e-5, 0.0, 0, scale)
    torch.testing.assert_close(outs[0].float(), want.float(), rtol=2e-2, atol=2e-2)


HEAD_KERNELS = {"float": "head_argmax_kernel_gdc", "int4": "int4_head_argmax_kernel_gdc"}


@pytest.mark.cuda
@pytest.mark.parametrize("width", HEAD_KERNELS)
def test_a_library_takes_the_token_in_its_head_kernel_call_after_call(width, tmp_path):
    """row_gemv_argmax as the decode pass places it, compiled by AOTInductor inside
    dependent_launches(): each call's token is its logits' argmax, and the library loads
    the head's (its width's) and the token's ``_gdc`` kernels and the slot's fill only."""
    _hopper()
    import re

    from targets.aoti.kernels import dependent_launch, ops
    _, w, norm = _head("cuda", rows=3000, cols=256)
    weight, scale = rows_of(w, width, torch.float16, "cuda")

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("weight", weight)
            self.register_buffer("scale", scale)
            self.register_buffer("norm", norm)

        def forward(self, x):
            return ops.row_gemv_argmax(x, self.weight, None, self.norm, 1e-5, 0.0,
                                       self.scale)

    x = torch.randn(1, 1, 256, device="cuda", dtype=torch.float16)
    program = torch.export.export(Head().eval(), (x,))
    with dependent_launch.dependent_launches() as dependent:
        assert dependent
        path, source = compile_library(program, tmp_path / "h.pt2")
    loaded = set(re.findall(r'loadKernel\(\s*(?:"[^"]*"|\w+)\s*,\s*"(\w+)"', source))
    run = load_library(path)
    for seed in range(3):
        x = torch.randn(1, 1, 256, device="cuda", dtype=torch.float16,
                        generator=torch.Generator("cuda").manual_seed(seed))
        logits, token = run(x)
        assert token.shape == (1,) and int(token) == int(logits.reshape(-1).argmax())
    # no copy of the slot or the token (torch copies what a kernel declares it writes,
    # and keeps the copy where it cannot write in place)
    fills = {name for name in loaded if "zeros" in name or "full" in name}
    assert loaded - fills == {HEAD_KERNELS[width], "slot_token_kernel_gdc"}, loaded
    assert len(fills) <= 1, loaded
