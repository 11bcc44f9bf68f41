"""targets/aoti/kernels/qkv_attention_o_triton.py: a layer's q/k/v product (norm and
rotary folded in), attention and o (+ residual) in one launch compute
reference.row_gemv's q/k/v rows split into q, k and v, then
reference.decode_attention_o; counts left at zero, the flag slots handed on from launch
to launch, the store form's cache rows. On the CPU under ``TRITON_INTERPRET=1``
(programs one after another, in order) or on a GPU; the 1.1B's shape on a Hopper GPU
(marked cuda: plain and dependent launches, a CUDA graph)."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels import reference
from targets.aoti.kernels.attention_o_slots import SLOTS, STRIDE, flag_slots
from tests.helpers import triton_device

pytest.importorskip("triton")

EPS, OFFSET = 1e-5, 0.0


def _layer(device, heads, kv_heads, slots, dim, hidden, dtype, seed=0, masked=(),
           rotary=True):
    """One layer's inputs: x (also o's residual), the norm's weight, q/k/v's rows, the
    rotary cos/sin of one position, the cache, a mask, o's rows."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device, dtype)
    angle = torch.rand(dim // 2, generator=g) * 6.0
    cos = torch.cat([angle.cos(), angle.cos()]).to(device, dtype) if rotary else None
    sin = torch.cat([angle.sin(), angle.sin()]).to(device, dtype) if rotary else None
    mask = torch.zeros(1, 1, 1, slots + 1)
    mask[..., list(masked)] = float("-inf")
    return dict(x=randn(1, 1, hidden), norm=(torch.rand(hidden, generator=g) + 0.5).to(
        device, dtype), wq=randn((heads + 2 * kv_heads) * dim, hidden, scale=0.1),
        cos=cos, sin=sin, past_k=randn(1, kv_heads, slots, dim),
        past_v=randn(1, kv_heads, slots, dim), mask=mask.to(device, dtype),
        wo=randn(hidden, heads * dim, scale=0.1), heads=heads)


def _launch(layer, counts, flags, slot, reset, config, pdl=False, positions=None, x=None,
            cache_ahead=False):
    """The joined launch over ``layer`` (int8 rows: its "sq"/"so" scales)."""
    from targets.aoti.kernels.qkv_attention_o_triton import launch_qkv_attention_o
    dim = layer["past_k"].shape[-1]
    return launch_qkv_attention_o(
        layer["x"] if x is None else x, layer["wq"], layer["norm"], EPS, OFFSET,
        layer["cos"], layer["sin"], layer["heads"], layer["past_k"], layer["past_v"],
        layer["mask"], dim ** -0.5, counts, layer["wo"], flags, slot, reset, config,
        positions=positions, pdl=pdl, cache_ahead=cache_ahead, qkv_scale=layer.get("sq"),
        o_scale=layer.get("so"))


def _want(layer, x=None):
    """(o's output, the q/k/v row): the decode pass's two ops' references composed."""
    cpu = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in layer.items()}
    x = cpu["x"] if x is None else x.cpu()
    heads, kv_heads, dim = cpu["heads"], cpu["past_k"].shape[1], cpu["past_k"].shape[-1]
    rotated = (heads + kv_heads) * dim if cpu["cos"] is not None else 0
    qkv = reference.row_gemv(x, cpu["wq"], None, cpu["norm"], None, EPS, OFFSET, 0,
                             cpu.get("sq"), cpu["cos"], cpu["sin"], rotated, dim)
    q = qkv[..., :heads * dim].view(1, heads, 1, dim)
    k = qkv[..., heads * dim:(heads + kv_heads) * dim].view(1, kv_heads, 1, dim)
    v = qkv[..., (heads + kv_heads) * dim:].view(1, kv_heads, 1, dim)
    state = torch.zeros(kv_heads, dtype=torch.int32)
    out = reference.decode_attention_o(q, cpu["past_k"], k, cpu["past_v"], v, cpu["mask"],
                                       dim ** -0.5, True, state, cpu["wo"], cpu.get("so"), x,
                                       torch.zeros(SLOTS * STRIDE, dtype=torch.int32), 0, 1)
    return out, qkv.reshape(-1)


def _state(device, kv_heads):
    return (torch.zeros(kv_heads, dtype=torch.int32, device=device),
            torch.zeros(SLOTS * STRIDE, dtype=torch.int32, device=device))


SHAPES = [  # heads, kv heads, slots, dim, hidden (o's rows: not a multiple of 4), config
    (4, 2, 32, 16, 70, (4, 16, 16, 2, 4, 4)),
    (8, 2, 100, 16, 33, (16, 32, 16, 3, 2, 2)),
    (4, 1, 20, 8, 17, (2, 0, 16, 1, 8, 4)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_launch_computes_qkv_then_the_attention_then_o(shape, dtype):
    """Against the composed references (float32 math): the norm, the rotary rows, some
    slots masked, blocks wholly past the cache or part-filled, q/k/v's columns not a
    power of two (loaded ahead, in steps, or both); counts back at zero, the flag counted
    once a key/value head, each head's q/k/v count once a program, the next slot zeroed."""
    device = triton_device()
    heads, kv_heads, slots, dim, rows, config = shape
    layer = _layer(device, heads, kv_heads, slots, dim, rows, dtype,
                   masked=(1, 5, slots - 1))
    counts, flags = _state(device, kv_heads)
    flags[1 * STRIDE:2 * STRIDE] = 7  # the slot this launch zeroes
    got, qkv = _launch(layer, counts, flags, 0, 1, config)
    want, want_qkv = _want(layer)
    tolerance = 2e-3 if dtype == torch.float32 else 2e-2
    assert got.shape == (1, 1, rows) and got.dtype == dtype
    torch.testing.assert_close(qkv.cpu().float(), want_qkv.float(), rtol=tolerance,
                               atol=tolerance)
    torch.testing.assert_close(got.cpu().float(), want.float(), rtol=tolerance,
                               atol=tolerance)
    assert counts.tolist() == [0] * kv_heads
    per_head = (heads // kv_heads + 2) * dim // config[0]
    assert flags[:1 + kv_heads].tolist() == [kv_heads] + [per_head] * kv_heads
    assert flags[STRIDE:2 * STRIDE].tolist() == [0] * STRIDE


@pytest.mark.parametrize("config", [(4, 16, 16, 2, 4, 4), (8, 0, 32, 3, 2, 2)])
def test_int8_rows_take_their_scales(config):
    """q/k/v's rows as int8 words (columns ahead and in steps, or steps only) and o's
    int8 rows, each with a scale a row (weight_rows.py's), against the references."""
    from tests.targets.aoti.weight_rows import rows_of
    device = triton_device()
    layer = _layer(device, 8, 2, 40, 16, 72, torch.float16, masked=(2, 39))
    layer["wq"], layer["sq"] = rows_of(layer["wq"].cpu().float(), "int8", torch.float16,
                                       device)
    layer["wo"], layer["so"] = rows_of(layer["wo"].cpu().float(), "int8", torch.float16,
                                       device)
    counts, flags = _state(device, 2)
    got, qkv = _launch(layer, counts, flags, 0, 1, config)
    want, want_qkv = _want(layer)
    torch.testing.assert_close(qkv.cpu().float(), want_qkv.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got.cpu().float(), want.float(), rtol=2e-2, atol=2e-2)
    assert counts.tolist() == [0, 0]
    with pytest.raises(ValueError, match="scale a row"):  # int8 rows without scales
        _launch({**layer, "so": None}, counts, flags, 0, 1, config)


def test_without_rotary_rows():
    device = triton_device()
    layer = _layer(device, 4, 2, 24, 16, 20, torch.float32, masked=(3,), rotary=False)
    counts, flags = _state(device, 2)
    got, _ = _launch(layer, counts, flags, 0, 1, (8, 16, 16, 2, 4, 4))
    torch.testing.assert_close(got.cpu(), _want(layer)[0], rtol=2e-3, atol=2e-3)


def test_layers_hand_the_flags_on_call_after_call():
    """Three layers in a row, each on its flag_slots slot, each layer's output the next's
    input, on one counts and one flags buffer, twice (the second call starts on the
    flags the first left): every output its layer's reference, the counts at zero."""
    device = triton_device()
    layers = [_layer(device, 8, 2, 48, 16, 64, torch.float32, seed=i, masked=(i,))
              for i in range(3)]
    counts, flags = _state(device, 2)
    for _ in range(2):
        h = layers[0]["x"]
        for layer, (slot, reset) in zip(layers, flag_slots(3)):
            want = _want(layer, h)[0]
            h, _ = _launch(layer, counts, flags, slot, reset, (4, 32, 16, 2, 4, 4), x=h)
            torch.testing.assert_close(h.cpu(), want, rtol=2e-3, atol=2e-3)
            assert flags[slot * STRIDE].item() == 2 and flags[reset * STRIDE].item() == 0
        assert counts.tolist() == [0, 0]


def test_the_store_form_writes_the_new_rows():
    """The new key and value (the stored q/k/v row's, rotated k) at slot position %
    slots, masked this step; the output as without it."""
    device = triton_device()
    layer = _layer(device, 4, 2, 16, 16, 12, torch.float32, masked=(11,))
    counts, flags = _state(device, 2)
    want, want_qkv = _want(layer)
    got, qkv = _launch(layer, counts, flags, 0, 1, (4, 16, 16, 2, 4, 4),
                       positions=torch.tensor([27], device=device))
    torch.testing.assert_close(got.cpu(), want, rtol=2e-3, atol=2e-3)
    k = qkv.cpu()[4 * 16:6 * 16].view(2, 16)
    v = qkv.cpu()[6 * 16:].view(2, 16)
    assert torch.equal(layer["past_k"].cpu()[0, :, 11], k)
    assert torch.equal(layer["past_v"].cpu()[0, :, 11], v)


def test_shapes_and_configs_it_does_not_take_are_refused():
    device = triton_device()
    layer = _layer(device, 4, 2, 16, 16, 12, torch.float32)
    counts, flags = _state(device, 2)
    for config in [(3, 16, 16, 2, 4, 4), (32, 16, 16, 2, 4, 4), (4, 8, 16, 2, 4, 4),
                   (4, 16, 16, 0, 4, 4), (4, 16, 16, 2, 3, 4)]:
        with pytest.raises(ValueError, match="config"):
            _launch(layer, counts, flags, 0, 1, config)
    with pytest.raises(ValueError, match="slots"):
        _launch(layer, counts, flags, 3, 0, (4, 16, 16, 2, 4, 4))
    wq = layer["wq"]
    layer["wq"] = wq[:-16]
    with pytest.raises(ValueError, match="q/k/v's rows"):
        _launch(layer, counts, flags, 0, 1, (4, 16, 16, 2, 4, 4))
    layer["wq"] = wq.t().contiguous().t()  # read before the wait: no copy taken
    with pytest.raises(ValueError, match="contiguous"):
        _launch(layer, counts, flags, 0, 1, (4, 16, 16, 2, 4, 4))


def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("dependent launches need a Hopper GPU")


@pytest.mark.cuda
@pytest.mark.parametrize("width", ["float", "int8"])
@pytest.mark.parametrize("pdl", [False, True])
def test_layers_at_the_1b_shape_in_a_cuda_graph(pdl, width):
    """Four layers at the ~1.1B's shapes (2,048 wide, 32 heads, 4 key/value heads of 64,
    512 slots) in CONFIG (the whole grid resident), each layer's output the next's input,
    as plain or dependent launches (the cache prefetched before the wait) captured in a
    CUDA graph and replayed three times: each output its layer's reference, counts at
    zero, the flags as flag_slots leaves them (the last layer's slot: 4 heads joined,
    each head's q/k/v programs). int8 rows at the chain's int8 configuration (32 q/k/v
    rows, 8 blocks of slots, 4 o rows: its grid resident too)."""
    from targets.aoti.kernels.qkv_attention_o_triton import CONFIG
    from tests.targets.aoti.weight_rows import rows_of
    _hopper()
    layers = [_layer("cuda", 32, 4, 512, 64, 2048, torch.float16, seed=i,
                     masked=range(400 + i, 512)) for i in range(4)]
    config = CONFIG if width == "float" else (32, 256, 256, 8, 4, 4)
    for layer in layers if width == "int8" else ():
        layer["wq"], layer["sq"] = rows_of(layer["wq"].float(), "int8", torch.float16, "cuda")
        layer["wo"], layer["so"] = rows_of(layer["wo"].float(), "int8", torch.float16, "cuda")
    counts, flags = _state("cuda", 4)
    pairs = flag_slots(len(layers))

    def step():
        outs, h = [], layers[0]["x"]
        for layer, (slot, reset) in zip(layers, pairs):
            h, _ = _launch(layer, counts, flags, slot, reset, config, pdl=pdl, x=h,
                           cache_ahead=pdl)
            outs.append(h)
        return outs
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        h = layers[0]["x"]
        for layer, out in zip(layers, outs):
            want = _want(layer, h)[0]
            torch.testing.assert_close(out.cpu().float(), want.float(), rtol=2e-2,
                                       atol=2e-2)
            h = out
        assert counts.tolist() == [0] * 4
        last, zeroed = pairs[-1]
        per_head = (8 + 2) * 64 // config[0]
        assert flags[last * STRIDE:last * STRIDE + 5].tolist() == [4] + [per_head] * 4
        assert flags[zeroed * STRIDE:(zeroed + 1) * STRIDE].tolist() == [0] * STRIDE
