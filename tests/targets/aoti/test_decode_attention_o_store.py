"""The attention + o launch's store form (kernels/attention_o_triton.py
``attention_o_store_kernel``, op ``edge_exporter::decode_attention_o_store``): the
joining program of each key/value head also writes the step's new key and value into
the past buffers at slot ``position % slots``, and o's output is what the launch without
the store computes (over float, int8 and int4 rows: weight_rows.py). Under
``TRITON_INTERPRET=1`` or on a GPU; the CUDA graph of dependent launches and the
library's kernels on a Hopper GPU only (marked cuda)."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels import ops, reference
from targets.aoti.kernels.attention_o_slots import SLOTS, STRIDE, flag_slots
from tests.targets.aoti.test_decode_attention_store import (_inputs,
                                                            _stored_as_the_cache_write_would)
from tests.targets.aoti.aoti_library import compile_library
from tests.targets.aoti.weight_rows import rows_of


def _state(device, kv_heads):
    """The join's counts and the flag slots, zeros (kept here, where no import needs
    Triton: test_decode_attention_o*.py import it)."""
    return (torch.zeros(kv_heads, dtype=torch.int32, device=device),
            torch.zeros(SLOTS * STRIDE, dtype=torch.int32, device=device))


def _o_rows(device, rows, cols, dtype, width="float", seed=1, group=128):
    """o's rows at ``width`` (weight_rows.py: float, int8 with a scale a row, int4 in
    groups of ``group``) and a residual: (weight, weight_scale, residual)."""
    g = torch.Generator().manual_seed(seed)
    weight, scale = rows_of(torch.randn(rows, cols, generator=g) * 0.1, width, dtype,
                            device, group)
    return weight, scale, torch.randn(1, 1, rows, generator=g).to(device, dtype)


def _launch(attention, o, counts, flags, slot=0, reset=1, positions=None, pdl=False,
            cache_ahead=True):
    from targets.aoti.kernels.attention_o_triton import launch_decode_attention_o
    weight, scale, residual = o
    return launch_decode_attention_o(*attention, cache_ahead, counts, weight, scale,
                                     residual, flags, slot, reset, positions=positions,
                                     pdl=pdl)


CASES = [  # (H, KVH, S, D), o's rows, position, window
    ((4, 2, 17, 16), 70, 5, None),        # a full cache part-filled
    ((8, 2, 100, 16), 129, 99, None),     # its last slot
    ((16, 4, 64, 64), 33, 200, 64),       # a ring wrapped round: slot 200 % 64 holds 136
    ((8, 1, 33, 16), 64, 33, 33),         # a ring's first wrap, slot 0
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("shape,rows,position,window", CASES)
def test_the_store_form_writes_the_rows_and_computes_the_launch_without_it(
        shape, rows, position, window, dtype):
    """o's output is the reference's and exactly the launch without the store (the slot
    written is masked this step); the past buffers differ from before only at the step's
    slot, which holds the new row; the counts are back at zero."""
    pytest.importorskip("triton")
    from tests.helpers import triton_device
    device = triton_device()
    *attention, positions = _inputs(shape, dtype, device, position, window)
    o = _o_rows(device, rows, shape[0] * shape[3], dtype)
    _, past_k, new_k, past_v, new_v = attention[:5]
    want_k = _stored_as_the_cache_write_would(past_k, new_k, position)
    want_v = _stored_as_the_cache_write_would(past_v, new_v, position)
    counts, flags = _state(device, shape[1])
    want = reference.decode_attention_o(*(t.cpu() if isinstance(t, torch.Tensor) else t
                                          for t in attention), True, counts.cpu(),
                                        o[0].cpu(), None, o[2].cpu(), flags.cpu(), 0, 1)
    plain = _launch(attention, o, counts, flags)
    # the other flag slot: the launch before left its own counted (flag_slots)
    got = _launch(attention, o, counts, flags, 1, 0, positions=positions)
    tolerance = 2e-3 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.cpu().float(), want.float(), rtol=tolerance,
                               atol=tolerance)
    assert torch.equal(got, plain)
    assert torch.equal(past_k, want_k) and torch.equal(past_v, want_v)
    assert not counts.any()


@pytest.mark.parametrize("position,window", [(40, None), (70, 64)])
@pytest.mark.parametrize("width", ["int8", "int4"])
def test_int8_and_int4_rows_store_as_well(width, position, window):
    """o's output exactly the plain launch's, the step's row at its slot (a ring wrapped
    round too) and nothing else changed, the counts back at zero (int4: groups of 64)."""
    pytest.importorskip("triton")
    from tests.helpers import triton_device
    device = triton_device()
    *attention, positions = _inputs((8, 2, 64, 16), torch.float16, device, position,
                                    window)
    o = _o_rows(device, 70, 128, torch.float16, width, group=64)
    want_k = _stored_as_the_cache_write_would(attention[1], attention[2], position)
    want_v = _stored_as_the_cache_write_would(attention[3], attention[4], position)
    counts, flags = _state(device, 2)
    plain = _launch(attention, o, counts, flags)
    got = _launch(attention, o, counts, flags, 1, 0, positions=positions)
    assert torch.equal(got, plain)
    assert torch.equal(attention[1], want_k) and torch.equal(attention[3], want_v)
    assert not counts.any()


def test_the_store_form_needs_the_cache_itself():
    """Past rows it would have to copy: it refuses rather than store into a copy."""
    pytest.importorskip("triton")
    *attention, positions = _inputs((4, 2, 16, 16), torch.float32, "cpu", 3)
    attention[1] = attention[1].transpose(2, 3).contiguous().transpose(2, 3)
    counts, flags = _state("cpu", 2)
    with pytest.raises(ValueError, match="unit stride"):
        _launch(attention, _o_rows("cpu", 8, 64, torch.float32), counts, flags,
                positions=positions)


@pytest.mark.parametrize("position,window", [(7, None), (21, 16)])
def test_the_op_on_the_cpu_mutates_its_cache_in_place(position, window):
    """The op's CPU kernel (the reference): decode_attention_o's output and the row in
    the caller's own buffers at the step's slot, nothing else changed."""
    *attention, positions = _inputs((4, 2, 16, 8), torch.float32, "cpu", position, window)
    weight, _, residual = _o_rows("cpu", 8, 32, torch.float32)
    past_k, new_k, past_v, new_v = attention[1:5]
    want_k = _stored_as_the_cache_write_would(past_k, new_k, position)
    want_v = _stored_as_the_cache_write_would(past_v, new_v, position)
    counts, flags = _state("cpu", 2)
    want = reference.decode_attention_o(*attention, True, counts, weight, None, residual,
                                        flags, 0, 1)
    buffers = past_k.data_ptr(), past_v.data_ptr()
    got = ops.decode_attention_o_store(*attention, True, counts, weight, None, residual,
                                       flags, 0, 1, positions)
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.equal(past_k, want_k) and torch.equal(past_v, want_v)
    assert (past_k.data_ptr(), past_v.data_ptr()) == buffers


def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("dependent launches need a Hopper GPU")


@pytest.mark.cuda
def test_steps_of_two_layers_in_a_cuda_graph_at_the_1b_shape():
    """Three one-token steps of two layers at the ~1.1B's shapes (32 heads, 4 key/value
    heads, 64 wide, a ring of 512 slots wrapped round, 2,048 rows), as the decode graph
    runs them: dependent launches reading the cache before their wait, the position's
    plain add after each step; replayed twice, each output is the reference over the
    cache the steps before filled and the caches are what the runtime's writes make."""
    _hopper()
    from exporter.lm.wrapper import attention_mask
    heads, kv_heads, slots, dim, rows, dtype = 32, 4, 512, 64, 2048, torch.float16
    g = torch.Generator().manual_seed(2)

    def made(*size):
        return torch.randn(size, generator=g).to("cuda", dtype)
    layers = [dict(k=made(1, kv_heads, slots, dim), v=made(1, kv_heads, slots, dim),
                   o=_o_rows("cuda", rows, heads * dim, dtype, seed=i)) for i in range(2)]
    wanted = [(layer["k"].clone(), layer["v"].clone()) for layer in layers]
    steps = [[[made(1, heads, 1, dim), made(1, kv_heads, 1, dim), made(1, kv_heads, 1, dim)]
              for _ in layers] for _ in range(6)]
    wants = []
    for position, step in enumerate(steps, start=509):
        mask = attention_mask(torch.tensor([position], device="cuda"), slots, slots, dtype)
        for (want_k, want_v), layer, (q, k, v) in zip(wanted, layers, step):
            weight, _, residual = layer["o"]
            wants.append(reference.decode_attention_o(
                q, want_k, k, want_v, v, mask, dim ** -0.5, True, None, weight, None,
                residual, None, 0, 0))
            want_k[:, :, position % slots], want_v[:, :, position % slots] = k[:, :, 0], v[:, :, 0]
    positions = torch.tensor([509], device="cuda")
    counts, flags = _state("cuda", kv_heads)
    inputs = [[[t.clone() for t in rows_] for rows_ in step] for step in steps[:3]]
    outs = []

    def three_steps():
        for step in inputs:
            mask = attention_mask(positions, slots, slots, dtype)
            for layer, (q, k, v), (slot, reset) in zip(layers, step, flag_slots(2)):
                attention = (q, layer["k"], k, layer["v"], v, mask, dim ** -0.5)
                outs.append(_launch(attention, layer["o"], counts, flags, slot, reset,
                                    positions=positions, pdl=True))
            positions.add_(1)
    saved = [(layer["k"].clone(), layer["v"].clone()) for layer in layers]
    three_steps()  # compiled outside the capture, then put back
    for layer, (k, v) in zip(layers, saved):
        layer["k"].copy_(k), layer["v"].copy_(v)
    positions.fill_(509)
    torch.cuda.synchronize()
    outs.clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        three_steps()
    for replay in range(2):
        for step, source in zip(inputs, steps[3 * replay:3 * replay + 3]):
            for targets, sources in zip(step, source):
                for target, value in zip(targets, sources):
                    target.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        for out, want in zip(outs, wants[6 * replay:6 * replay + 6]):
            torch.testing.assert_close(out.float(), want.float(), rtol=2e-2, atol=2e-2)
    for layer, (want_k, want_v) in zip(layers, wanted):
        assert torch.equal(layer["k"], want_k) and torch.equal(layer["v"], want_v)
    assert not counts.any()


class _Step(torch.nn.Module):
    """The op as the decode pass places it: the cache and positions are step inputs."""

    def __init__(self, weight):
        super().__init__()
        self.register_buffer("weight", weight)

    def forward(self, q, past_k, new_k, past_v, new_v, mask, residual, positions):
        counts = torch.zeros(4, dtype=torch.int32, device=q.device)
        flags = torch.zeros(SLOTS * STRIDE, dtype=torch.int32, device=q.device)
        return ops.decode_attention_o_store(q, past_k, new_k, past_v, new_v, mask, 0.125,
                                            True, counts, self.weight, None, residual,
                                            flags, 0, 1, positions)


@pytest.mark.cuda
def test_a_library_stores_the_rows_with_no_copy_of_the_cache(tmp_path):
    """The op compiled by AOTInductor inside dependent_launches(): the library loads the
    store form's ``_gdc`` kernel and at most the buffers' fills, and calls no copy or
    clone (the past buffers it declares written are written in place: the op mutates
    its inputs). Read from the package's source, not loaded."""
    _hopper()
    import re

    from bench.library_kernels import copy_calls
    from targets.aoti.kernels import dependent_launch
    *attention, positions = _inputs((32, 4, 512, 64), torch.float16, "cuda", 300)
    weight, _, residual = _o_rows("cuda", 2048, 2048, torch.float16)
    program = torch.export.export(_Step(weight).eval(), (*attention[:6], residual,
                                                         positions))
    with dependent_launch.dependent_launches() as dependent:
        assert dependent
        path, source = compile_library(program, tmp_path / "s.pt2")
    loaded = set(re.findall(r'loadKernel\(\s*(?:"[^"]*"|\w+)\s*,\s*"(\w+)"', source))
    fills = {name for name in loaded if "zeros" in name or "full" in name or "fill" in name}
    assert loaded - fills == {"attention_o_store_kernel_gdc"}, loaded
    assert not copy_calls(source)
