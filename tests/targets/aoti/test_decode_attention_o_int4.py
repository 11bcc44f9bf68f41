"""The attention + o launch over int4 o rows (kernels/attention_o_triton.py, GROUP > 0:
int4_triton.py's tiles and loop in o's programs): its plain and store forms compute
reference.decode_attention_o over the int4 rows (reference.row_gemv unpacks them), leave
the counts at zero and the flags as the float rows do. Under ``TRITON_INTERPRET=1`` or on
a GPU; the CUDA graph of dependent launches and the library's kernels on a Hopper GPU
only (marked cuda)."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels import int4_rows, reference
from targets.aoti.kernels.attention_o_slots import SLOTS, STRIDE, flag_slots
from tests.helpers import triton_device
from tests.targets.aoti.test_decode_attention_store import (_inputs,
                                                            _stored_as_the_cache_write_would)
from tests.targets.aoti.aoti_library import compile_library

pytest.importorskip("triton")


def _int4_o(device, rows, cols, dtype, group, seed=1):
    """o's int4 rows (packed, their (scale, offset) pairs) and a residual."""
    g = torch.Generator().manual_seed(seed)
    packed, scales = int4_rows.pack((torch.randn(rows, cols, generator=g) * 0.1).to(dtype),
                                    group)
    return packed.to(device), scales.to(device), torch.randn(1, 1, rows, generator=g).to(
        device, dtype)


def _state(device, kv_heads):
    return (torch.zeros(kv_heads, dtype=torch.int32, device=device),
            torch.zeros(SLOTS * STRIDE, dtype=torch.int32, device=device))


def _launch(attention, o, counts, flags, slot=0, reset=1, positions=None, pdl=False):
    from targets.aoti.kernels.attention_o_triton import launch_decode_attention_o
    packed, scales, residual = o
    return launch_decode_attention_o(*attention, True, counts, packed, scales, residual,
                                     flags, slot, reset, positions=positions, pdl=pdl)


def _want(attention, o, residual=None):
    packed, scales, given = o
    return reference.decode_attention_o(
        *(t.cpu() if isinstance(t, torch.Tensor) else t for t in attention), True, None,
        packed.cpu(), scales.cpu(), (given if residual is None else residual).cpu(), None,
        0, 0)


CASES = [  # (H, KVH, S, D), o's rows, group: o's columns in one, two and four steps
    ((4, 2, 32, 16), 70, 32),
    ((8, 2, 100, 16), 129, 64),
    ((32, 4, 40, 64), 33, 128),    # 2,048 columns: two steps of 8 groups (the ~1.1B's)
    ((32, 4, 24, 128), 9, 128),    # 4,096: four steps, the second tile ahead in the loop
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape,rows,group", CASES)
def test_int4_rows_take_their_groups_pairs(shape, rows, group, dtype):
    """Against the reference over the unpacked rows: masked slots, the new row, rows not
    a multiple of a program's 4; the counts back at zero, the flag counted once a
    key/value head, the next launch's slot zeroed."""
    device = triton_device()
    *attention, _ = _inputs(shape, dtype, device, 3)
    o = _int4_o(device, rows, shape[0] * shape[3], dtype, group)
    counts, flags = _state(device, shape[1])
    flags[STRIDE] = 7  # the slot this launch zeroes
    got = _launch(attention, o, counts, flags)
    tolerance = 2e-3 if dtype == torch.float32 else 2e-2
    assert got.shape == (1, 1, rows) and got.dtype == dtype
    torch.testing.assert_close(got.cpu().float(), _want(attention, o).float(),
                               rtol=tolerance, atol=tolerance)
    assert not counts.any()
    assert flags[0].item() == shape[1] and flags[STRIDE].item() == 0


@pytest.mark.parametrize("position,window", [(40, None), (70, 64)])
def test_the_store_form_over_int4_rows(position, window):
    """The store form: o's output exactly the plain launch's, the step's row at its slot
    (a ring wrapped round too) and nothing else changed."""
    device = triton_device()
    *attention, positions = _inputs((8, 2, 64, 16), torch.float16, device, position,
                                    window)
    o = _int4_o(device, 70, 128, torch.float16, 64)
    want_k = _stored_as_the_cache_write_would(attention[1], attention[2], position)
    want_v = _stored_as_the_cache_write_would(attention[3], attention[4], position)
    counts, flags = _state(device, 2)
    plain = _launch(attention, o, counts, flags)
    got = _launch(attention, o, counts, flags, 1, 0, positions=positions)
    assert torch.equal(got, plain)
    assert torch.equal(attention[1], want_k) and torch.equal(attention[3], want_v)
    assert not counts.any()


def test_layers_over_int4_rows_hand_the_flags_on():
    """Three layers on flag_slots' slots, twice, one counts and flags buffer."""
    device = triton_device()
    layers = [(_inputs((8, 2, 48, 16), torch.float32, device, 5 + i, seed=i)[:7],
               _int4_o(device, 64, 128, torch.float32, 32, seed=i)) for i in range(3)]
    counts, flags = _state(device, 2)
    for _ in range(2):
        for (attention, o), (slot, reset) in zip(layers, flag_slots(3)):
            got = _launch(attention, o, counts, flags, slot, reset)
            torch.testing.assert_close(got.cpu(), _want(attention, o), rtol=2e-3,
                                       atol=2e-3)
            assert flags[slot * STRIDE].item() == 2 and flags[reset * STRIDE].item() == 0
        assert not counts.any()


def test_pairs_of_another_shape_are_refused():
    device = triton_device()
    *attention, _ = _inputs((4, 2, 16, 16), torch.float32, device, 3)
    packed, scales, residual = _int4_o(device, 8, 64, torch.float32, 32)
    counts, flags = _state(device, 2)
    with pytest.raises(ValueError, match="pairs"):
        _launch(attention, (packed, scales[:4], residual), counts, flags)
    with pytest.raises(ValueError, match="not joined"):  # 64 columns, packed as 32
        _launch(attention, (packed[:, :16], scales, residual), counts, flags)


def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("dependent launches need a Hopper GPU")


@pytest.mark.cuda
@pytest.mark.parametrize("store", [False, True])
def test_dependent_int4_layers_in_a_cuda_graph_at_the_1b_shape(store):
    """Four layers at the ~1.1B's shapes (32 heads over 4, 64 wide, 512 slots, o 2,048
    int4 rows in groups of 128), each o feeding the next's residual, as dependent
    launches in a CUDA graph replayed three times: each output its layer's reference,
    counts at zero, flags as flag_slots leaves them; the store form writes slot 450
    (masked: the replays read the same cache) with the step's row."""
    _hopper()
    heads, kv_heads, slots, dim, rows = 32, 4, 512, 64, 2048
    layers = []
    for i in range(4):
        *attention, positions = _inputs((heads, kv_heads, slots, dim), torch.float16,
                                        "cuda", 450, seed=i)
        attention[5] = attention[5].clone()
        attention[5][..., 400 + i:slots] = float("-inf")
        layers.append((attention, _int4_o("cuda", rows, heads * dim, torch.float16, 128,
                                          seed=i)))
    counts, flags = _state("cuda", kv_heads)
    positions = torch.tensor([450], device="cuda") if store else None

    def step():
        outs, h = [], layers[0][1][2]
        for (attention, (packed, scales, _)), (slot, reset) in zip(layers, flag_slots(4)):
            h = _launch(attention, (packed, scales, h), counts, flags, slot, reset,
                        positions=positions, pdl=True)
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
        h = layers[0][1][2]
        for (attention, o), out in zip(layers, outs):
            want = _want(attention, o, residual=h)
            torch.testing.assert_close(out.cpu().float(), want.float(), rtol=2e-2,
                                       atol=2e-2)
            h = out
        assert not counts.any()
        assert [flags[s * STRIDE].item() for s in range(SLOTS)] == [0, 4, 0]
    if store:
        for attention, _ in layers:
            assert torch.equal(attention[1][:, :, 450], attention[2][:, :, 0])
            assert torch.equal(attention[3][:, :, 450], attention[4][:, :, 0])


@pytest.mark.cuda
def test_a_library_loads_the_joined_kernel_over_int4_rows_alone(tmp_path):
    """decode_attention_o over int4 rows compiled by AOTInductor inside
    dependent_launches(): the package loads the joined ``_gdc`` kernel and at most the
    buffers' fills, no copy. Read from the package's source, not loaded."""
    _hopper()
    import re

    from bench.library_kernels import copy_calls
    from targets.aoti.kernels import dependent_launch, ops
    *attention, _ = _inputs((32, 4, 512, 64), torch.float16, "cuda", 300)
    packed, scales, residual = _int4_o("cuda", 2048, 2048, torch.float16, 128)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("packed", packed)
            self.register_buffer("scales", scales)

        def forward(self, query, past_k, new_k, past_v, new_v, mask, residual):
            counts = torch.zeros(4, dtype=torch.int32, device=query.device)
            flags = torch.zeros(SLOTS * STRIDE, dtype=torch.int32, device=query.device)
            return ops.decode_attention_o(query, past_k, new_k, past_v, new_v, mask,
                                          0.125, True, counts, self.packed, self.scales,
                                          residual, flags, 0, 1)

    program = torch.export.export(Layer().eval(), (*attention[:6], residual))
    with dependent_launch.dependent_launches() as dependent:
        assert dependent
        path, source = compile_library(program, tmp_path / "a.pt2")
    loaded = set(re.findall(r'loadKernel\(\s*(?:"[^"]*"|\w+)\s*,\s*"(\w+)"', source))
    fills = {name for name in loaded if "zeros" in name or "full" in name or "fill" in name}
    assert loaded - fills == {"attention_o_kernel_gdc"}, loaded
    assert not copy_calls(source)
