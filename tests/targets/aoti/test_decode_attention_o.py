"""targets/aoti/kernels/attention_o_triton.py (the decode_attention_o op's kernel): a
layer's attention and o (+ residual) in one launch compute reference.decode_attention_o
(the attention, then row_gemv), leave the join's counts at zero and hand the flag slots
on from launch to launch; the flags handed on, the CUDA graph (plain and store forms) and
the library over o's rows of each width (weight_rows.py; int4-only checks:
test_decode_attention_o_int4.py). On the CPU under ``TRITON_INTERPRET=1`` (programs one
after another, in order: the attention's before o's spin) or on a GPU; the CUDA graph of
dependent launches and the library's kernels on a Hopper GPU only (marked cuda)."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels import reference
from targets.aoti.kernels.attention_o_slots import SLOTS, STRIDE, flag_slots
from tests.helpers import triton_device
from tests.targets.aoti.aoti_library import compile_library
from tests.targets.aoti.test_decode_attention_o_store import _state
from tests.targets.aoti.weight_rows import WIDTHS, rows_of

pytest.importorskip("triton")


def _layer(device, heads, kv_heads, slots, dim, rows, dtype, width="float", seed=0,
           masked=(), group=128):
    """One layer's inputs: the query, the cache, the new row, a mask (``masked``: slots
    masked besides those past the cache's fill), o's rows at ``width`` (weight_rows.py)
    and a residual."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device, dtype)
    query = randn(1, heads, 1, dim)
    past_k, past_v = randn(1, kv_heads, slots, dim), randn(1, kv_heads, slots, dim)
    new_k, new_v = randn(1, kv_heads, 1, dim), randn(1, kv_heads, 1, dim)
    mask = torch.zeros(1, 1, 1, slots + 1)
    mask[..., list(masked)] = float("-inf")
    mask = mask.to(device, dtype)
    weight, scale = rows_of(torch.randn(rows, heads * dim, generator=g) * 0.1, width, dtype,
                            device, group)
    residual = randn(1, 1, rows)
    return (query, past_k, new_k, past_v, new_v, mask, dim ** -0.5), weight, scale, residual


def _launch(attention, weight, scale, residual, counts, flags, slot, reset, pdl=False,
            positions=None, config=None):
    from targets.aoti.kernels.attention_o_triton import launch_decode_attention_o
    return launch_decode_attention_o(*attention, True, counts, weight, scale, residual,
                                     flags, slot, reset, positions=positions, pdl=pdl,
                                     config=config)


def _want(attention, weight, scale, residual, counts, flags):
    return reference.decode_attention_o(*(t.cpu() if isinstance(t, torch.Tensor) else t
                                          for t in attention), True, counts.cpu(),
                                        weight.cpu(), None if scale is None else scale.cpu(),
                                        residual.cpu(), flags.cpu(), 0, 1)


SHAPES = [  # heads, kv heads, slots, dim, o's rows (not a multiple of a program's 4)
    (4, 2, 32, 16, 70),
    (8, 2, 100, 16, 129),
    (16, 4, 64, 64, 33),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_launch_computes_the_attention_then_o(shape, dtype):
    """Against the reference (float32 math): some slots masked, blocks wholly past the
    cache (32 slots: 4 blocks of 16) or part-filled (100: blocks of 32), the new row, the
    residual; counts back at zero, the flag counted once a key/value head, the next
    launch's slot zeroed."""
    device = triton_device()
    heads, kv_heads, slots, dim, rows = shape
    attention, weight, scale, residual = _layer(device, heads, kv_heads, slots, dim, rows,
                                                dtype, masked=(1, 5, slots - 1))
    counts, flags = _state(device, kv_heads)
    flags[1 * STRIDE] = 7  # the slot this launch zeroes
    got = _launch(attention, weight, scale, residual, counts, flags, 0, 1)
    want = _want(attention, weight, scale, residual, counts, flags)
    tolerance = 2e-3 if dtype == torch.float32 else 2e-2
    assert got.shape == residual.shape[:-1] + (rows,) and got.dtype == dtype
    torch.testing.assert_close(got.cpu().float(), want.float(), rtol=tolerance,
                               atol=tolerance)
    assert counts.tolist() == [0] * kv_heads
    assert flags[0].item() == kv_heads and flags[STRIDE].item() == 0


def test_int8_rows_take_their_scales():
    device = triton_device()
    attention, weight, scale, residual = _layer(device, 8, 2, 64, 16, 70, torch.float16,
                                                "int8", masked=(3,))
    counts, flags = _state(device, 2)
    got = _launch(attention, weight, scale, residual, counts, flags, 0, 1)
    want = _want(attention, weight, scale, residual, counts, flags)
    torch.testing.assert_close(got.cpu().float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("width", ["float", "int4"])
def test_layers_hand_the_flags_on_call_after_call(width):
    """Three layers in a row, each on its flag_slots slot, on one counts and one flags
    buffer, twice (the second call starts on the flags the first left): every output is
    its layer's reference, the counts back at zero (int4 rows in groups of 32)."""
    device = triton_device()
    layers = [_layer(device, 8, 2, 48, 16, 64, torch.float32, width, seed=i, masked=(i,),
                     group=32) for i in range(3)]
    counts, flags = _state(device, 2)
    for _ in range(2):
        for (attention, weight, scale, residual), (slot, reset) in zip(layers,
                                                                        flag_slots(3)):
            got = _launch(attention, weight, scale, residual, counts, flags, slot, reset)
            want = _want(attention, weight, scale, residual, counts, flags)
            torch.testing.assert_close(got.cpu(), want, rtol=2e-3, atol=2e-3)
            assert flags[slot * STRIDE].item() == 2 and flags[reset * STRIDE].item() == 0
        assert counts.tolist() == [0, 0]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("config", [(1, 8, 4), (8, 2, 8), (3, 1, 2)])
def test_another_config_computes_the_same(config, width):
    """(blocks of slots, o's rows a program, warps) other than a build's, as the timing
    scripts' chain variants launch them: one block or more blocks than a head's slots
    fill, rows past o's last (70 rows), int4 rows in groups of 32."""
    device = triton_device()
    attention, weight, scale, residual = _layer(device, 8, 2, 20, 16, 70, torch.float16,
                                                width, masked=(2,), group=32)
    counts, flags = _state(device, 2)
    got = _launch(attention, weight, scale, residual, counts, flags, 0, 1, config=config)
    want = _want(attention, weight, scale, residual, counts, flags)
    torch.testing.assert_close(got.cpu().float(), want.float(), rtol=2e-2, atol=2e-2)
    assert counts.tolist() == [0, 0] and flags[0].item() == 2


def test_shapes_the_kernel_does_not_take_are_refused():
    device = triton_device()
    attention, weight, scale, residual = _layer(device, 3, 1, 32, 16, 8, torch.float32)
    counts, flags = _state(device, 1)
    with pytest.raises(ValueError, match="not joined"):  # 48 columns: not one tile
        _launch(attention, weight, scale, residual, counts, flags, 0, 1)
    attention, weight, scale, residual = _layer(device, 4, 1, 32, 16, 8, torch.float32)
    with pytest.raises(ValueError, match="slots"):
        _launch(attention, weight, scale, residual, counts, flags, 3, 0)
    with pytest.raises(ValueError, match="slots"):
        _launch(attention, weight, scale, residual, counts, flags[:STRIDE], 0, 1)
    for config in [(0, 4, 4), (4, 3, 4), (4, 4, 3)]:
        with pytest.raises(ValueError, match="config"):
            _launch(attention, weight, scale, residual, counts, flags, 0, 1, config=config)


def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("dependent launches need a Hopper GPU")


@pytest.mark.cuda
@pytest.mark.parametrize("store", [False, True])
@pytest.mark.parametrize("width", WIDTHS)
def test_dependent_layers_in_a_cuda_graph_at_the_1b_shape(width, store):
    """Four layers at the ~1.1B's shapes (32 heads, 4 key/value heads, 64 wide, 512
    slots, 2,048 rows of o, int4 in groups of 128), each layer's o feeding the next's
    residual, as dependent launches captured in a CUDA graph and replayed three times:
    each output is its layer's reference, counts at zero, the flags as flag_slots leaves
    them; the store form writes slot 450 (masked: the replays read the same cache) with
    the step's row."""
    _hopper()
    layers = [_layer("cuda", 32, 4, 512, 64, 2048, torch.float16, width, seed=i,
                     masked=range(400 + i, 512)) for i in range(4)]
    counts, flags = _state("cuda", 4)
    pairs = flag_slots(len(layers))
    positions = torch.tensor([450], device="cuda") if store else None

    def step():
        outs, h = [], layers[0][3]
        for (attention, weight, scale, _), (slot, reset) in zip(layers, pairs):
            h = _launch(attention, weight, scale, h, counts, flags, slot, reset, pdl=True,
                        positions=positions)
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
        h = layers[0][3]
        for (attention, weight, scale, _), out in zip(layers, outs):
            want = _want(attention, weight, scale, h, counts, flags)
            torch.testing.assert_close(out.cpu().float(), want.float(), rtol=2e-2,
                                       atol=2e-2)
            h = out
        assert counts.tolist() == [0] * 4
        assert [flags[s * STRIDE].item() for s in range(SLOTS)] == [0, 4, 0]
    if store:
        for attention, *_ in layers:
            assert torch.equal(attention[1][:, :, 450], attention[2][:, :, 0])
            assert torch.equal(attention[3][:, :, 450], attention[4][:, :, 0])


@pytest.mark.cuda
@pytest.mark.parametrize("width", ["float", "int4"])
def test_a_library_loads_the_joined_kernel_alone(width, tmp_path):
    """decode_attention_o compiled by AOTInductor inside dependent_launches(): the
    package's wrapper loads the joined ``_gdc`` kernel and at most the buffers' fills, no
    copy of the counts or flags (what a kernel declares written, torch copies where it
    cannot write in place). Read from the package's source, not loaded."""
    _hopper()
    import re

    from bench.library_kernels import copy_calls
    from targets.aoti.kernels import dependent_launch, ops
    attention, weight, scale, residual = _layer("cuda", 32, 4, 512, 64, 2048, torch.float16,
                                                width)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("weight", weight)
            self.register_buffer("scale", scale)

        def forward(self, query, past_k, new_k, past_v, new_v, mask, residual):
            counts = torch.zeros(4, dtype=torch.int32, device=query.device)
            flags = torch.zeros(SLOTS * STRIDE, dtype=torch.int32, device=query.device)
            return ops.decode_attention_o(query, past_k, new_k, past_v, new_v, mask,
                                          0.125, True, counts, self.weight, self.scale,
                                          residual, flags, 0, 1)

    program = torch.export.export(Layer().eval(), (*attention[:6], residual))
    with dependent_launch.dependent_launches() as dependent:
        assert dependent
        path, source = compile_library(program, tmp_path / "a.pt2")
    loaded = set(re.findall(r'loadKernel\(\s*(?:"[^"]*"|\w+)\s*,\s*"(\w+)"', source))
    fills = {name for name in loaded if "zeros" in name or "full" in name or "fill" in name}
    assert loaded - fills == {"attention_o_kernel_gdc"}, loaded
    assert not copy_calls(source)
