"""The decode attention's store form (kernels/decode_attention.py ``attention_store_kernel``,
op ``edge_exporter::decode_attention_store``): the joining program of each key/value head
writes the step's new key and value into the past buffers at slot ``position % slots``,
and the attention is what the plain join computes. The kernel on a GPU or under
``TRITON_INTERPRET=1``; the op's reference and a CPU AOTInductor library on the CPU."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels import ops, reference
from tests.targets.aoti.aoti_library import compile_library, load_library


def _inputs(shape, dtype, device, position, window=None, seed=0):
    """A step's inputs at ``position`` with the mask the wrapper builds (full cache:
    ``window`` None and slots = context; else a ring of ``slots`` = window)."""
    from exporter.lm.wrapper import attention_mask
    heads, kv_heads, slots, dim = shape
    generator = torch.Generator().manual_seed(seed)

    def made(*size):
        return torch.randn(size, generator=generator).to(device=device, dtype=dtype)
    q = made(1, heads, 1, dim)
    past_k, past_v = made(1, kv_heads, slots, dim), made(1, kv_heads, slots, dim)
    new_k, new_v = made(1, kv_heads, 1, dim), made(1, kv_heads, 1, dim)
    positions = torch.tensor([position], device=device)
    mask = attention_mask(positions, slots, window, dtype)
    return q, past_k, new_k, past_v, new_v, mask, dim ** -0.5, positions


def _stored_as_the_cache_write_would(past, new, position):
    want = past.clone()
    want[:, :, position % past.shape[2]] = new[:, :, 0]
    return want


CASES = [  # (H, KVH, S, D), position, window
    ((4, 4, 17, 16), 5, None),          # a full cache part-filled
    ((8, 2, 100, 80), 99, None),        # its last slot
    ((32, 4, 64, 64), 200, 64),         # a ring wrapped round: slot 200 % 64 holds 136
    ((8, 1, 33, 64), 33, 33),           # a ring's first wrap, slot 0
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("shape,position,window", CASES)
def test_the_store_form_writes_the_row_at_its_slot_and_attends_as_the_join(
        shape, position, window, dtype):
    """The attention is the reference's and the plain join's (the slot written is masked
    this step); the past buffers differ from before only at the step's slot, which holds
    the new row; the counts are back at zero."""
    pytest.importorskip("triton")
    from targets.aoti.kernels.decode_attention import launch_decode_attention
    from tests.helpers import triton_device
    device = triton_device()
    q, past_k, new_k, past_v, new_v, mask, scale, positions = _inputs(
        shape, dtype, device, position, window)
    want_k = _stored_as_the_cache_write_would(past_k, new_k, position)
    want_v = _stored_as_the_cache_write_would(past_v, new_v, position)
    want = reference.decode_attention(q, past_k, new_k, past_v, new_v, mask, scale).float()
    counts = torch.zeros(shape[1] + 2, device=device, dtype=torch.int32)
    joined = launch_decode_attention(q, past_k, new_k, past_v, new_v, mask, scale,
                                     counts=counts).float()
    got = launch_decode_attention(q, past_k, new_k, past_v, new_v, mask, scale,
                                  counts=counts, positions=positions).float()
    bound = 2e-3 if dtype == torch.float16 else 1e-5
    assert ((got - want).norm() / want.norm()).item() < bound
    assert torch.equal(got, joined)
    assert torch.equal(past_k, want_k) and torch.equal(past_v, want_v)
    assert not counts.any()


def test_the_store_form_needs_counts_and_the_cache_itself():
    """Without the join's counts, or with past rows it would have to copy, it refuses
    rather than store into nothing or into a copy."""
    pytest.importorskip("triton")
    from targets.aoti.kernels.decode_attention import launch_decode_attention
    q, past_k, new_k, past_v, new_v, mask, scale, positions = _inputs(
        (4, 2, 16, 16), torch.float32, "cpu", 3)
    with pytest.raises(ValueError):
        launch_decode_attention(q, past_k, new_k, past_v, new_v, mask, scale,
                                positions=positions)
    counts = torch.zeros(2, dtype=torch.int32)
    strided = past_k.transpose(2, 3).contiguous().transpose(2, 3)
    with pytest.raises(ValueError):
        launch_decode_attention(q, strided, new_k, past_v, new_v, mask, scale,
                                counts=counts, positions=positions)


@pytest.mark.parametrize("position,window", [(7, None), (21, 16)])
def test_the_op_on_the_cpu_mutates_its_cache_in_place(position, window):
    """The op's CPU kernel (the reference): the attention of ``decode_attention`` and
    the row in the caller's own buffers at the step's slot, nothing else changed."""
    shape = (4, 2, 16, 8)
    q, past_k, new_k, past_v, new_v, mask, scale, positions = _inputs(
        shape, torch.float32, "cpu", position, window)
    want_k = _stored_as_the_cache_write_would(past_k, new_k, position)
    want_v = _stored_as_the_cache_write_would(past_v, new_v, position)
    want = reference.decode_attention(q, past_k, new_k, past_v, new_v, mask, scale)
    k_buffer, v_buffer = past_k.data_ptr(), past_v.data_ptr()
    got = ops.decode_attention_store(q, past_k, new_k, past_v, new_v, mask, scale, True,
                                     torch.zeros(2, dtype=torch.int32), positions)
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.equal(past_k, want_k) and torch.equal(past_v, want_v)
    assert (past_k.data_ptr(), past_v.data_ptr()) == (k_buffer, v_buffer)


class _Step(torch.nn.Module):
    """The op as the decode pass places it: the cache and positions are step inputs."""

    def forward(self, q, past_k, new_k, past_v, new_v, mask, counts, positions):
        return ops.decode_attention_store(q, past_k, new_k, past_v, new_v, mask, 0.35,
                                          True, counts, positions)


def test_a_cpu_library_stores_the_row_in_the_callers_own_buffer(tmp_path):
    """torch.export keeps the op's mutation of its inputs, and a CPU AOTInductor library
    runs it on the buffers it is given: the row lands in them, not in a copy. The op as
    a machine without Triton defines it (with Triton, Inductor traces into its kernels,
    which need a GPU: test_a_library_stores_the_rows_with_no_copy_of_the_cache there)."""
    if ops.TRITON:
        pytest.skip("with Triton installed the op's library needs a GPU")
    shape = (4, 2, 16, 8)
    q, past_k, new_k, past_v, new_v, mask, _, positions = _inputs(
        shape, torch.float32, "cpu", 9)
    counts = torch.zeros(2, dtype=torch.int32)
    program = torch.export.export(_Step().eval(), (q, past_k.clone(), new_k, past_v.clone(),
                                                   new_v, mask, counts, positions))
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert ops.decode_attention_store in targets
    path, _ = compile_library(program, tmp_path / "s.pt2")
    run = load_library(path)
    want_k = _stored_as_the_cache_write_would(past_k, new_k, 9)
    want_v = _stored_as_the_cache_write_would(past_v, new_v, 9)
    want = reference.decode_attention(q, past_k, new_k, past_v, new_v, mask, 0.35)
    got = run(q, past_k, new_k, past_v, new_v, mask, counts, positions)
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.equal(past_k, want_k) and torch.equal(past_v, want_v)


def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("dependent launches need a Hopper GPU")


@pytest.mark.cuda
def test_steps_in_a_cuda_graph_read_the_rows_the_step_before_stored():
    """Three one-token steps of one layer as a decode graph runs them: the mask from the
    position, the store form as a dependent launch reading the cache before its wait,
    then the position's plain add; replayed twice, each step's output is the reference
    over the cache the steps before filled, and the cache is what the runtime's write
    would have made of it (a ring of 8 slots, wrapped round)."""
    _hopper()
    from exporter.lm.wrapper import attention_mask
    from targets.aoti.kernels.decode_attention import launch_decode_attention
    heads, kv_heads, slots, dim, dtype = 8, 2, 8, 64, torch.float16
    generator = torch.Generator().manual_seed(2)
    steps = 6
    rows = [[torch.randn(size, generator=generator).to("cuda", dtype) for size in (
        (1, heads, 1, dim), (1, kv_heads, 1, dim), (1, kv_heads, 1, dim))]
        for _ in range(steps)]
    past_k = torch.randn(1, kv_heads, slots, dim, generator=generator).to("cuda", dtype)
    past_v = torch.randn(1, kv_heads, slots, dim, generator=generator).to("cuda", dtype)
    want_k, want_v = past_k.clone(), past_v.clone()
    wants = []
    for position, (q, k, v) in enumerate(rows, start=5):
        mask = attention_mask(torch.tensor([position], device="cuda"), slots, slots, dtype)
        wants.append(reference.decode_attention(q, want_k, k, want_v, v, mask, dim ** -0.5))
        want_k[:, :, position % slots], want_v[:, :, position % slots] = k[:, :, 0], v[:, :, 0]
    positions = torch.tensor([5], device="cuda")
    counts = torch.zeros(kv_heads, device="cuda", dtype=torch.int32)
    inputs = [[t.clone() for t in step] for step in rows[:3]]
    outs = []

    def three_steps():
        for q, k, v in inputs:
            mask = attention_mask(positions, slots, slots, dtype)
            outs.append(launch_decode_attention(q, past_k, k, past_v, v, mask, dim ** -0.5,
                                                pdl=True, cache_ahead=True, counts=counts,
                                                positions=positions))
            positions.add_(1)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # compiled outside the capture, then put back
        saved = past_k.clone(), past_v.clone(), positions.clone()
        three_steps()
        past_k.copy_(saved[0]), past_v.copy_(saved[1]), positions.copy_(saved[2])
    torch.cuda.synchronize()
    outs.clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        three_steps()
    for replay in range(2):
        for step, t in enumerate(inputs):
            for target, source in zip(t, rows[3 * replay + step]):
                target.copy_(source)
        graph.replay()
        torch.cuda.synchronize()
        for step, out in enumerate(outs):
            want = wants[3 * replay + step].float()
            assert ((out.float() - want).norm() / want.norm()).item() < 2e-3
    assert torch.equal(past_k, want_k) and torch.equal(past_v, want_v)
    assert not counts.any()


@pytest.mark.cuda
def test_a_library_stores_the_rows_with_no_copy_of_the_cache(tmp_path):
    """The op compiled by AOTInductor inside dependent_launches(), as the decode pass
    places it: the library loads the store form's ``_gdc`` kernel and nothing else (no
    copy of the past buffers it declares it writes: torch writes them in place because
    the op mutates its inputs), and calls no copy or clone of a tensor."""
    _hopper()
    import re

    from bench.library_kernels import copy_calls
    from targets.aoti.kernels import dependent_launch
    q, past_k, new_k, past_v, new_v, mask, _, positions = _inputs(
        (32, 4, 512, 64), torch.float16, "cuda", 300)
    counts = torch.zeros(4, device="cuda", dtype=torch.int32)
    program = torch.export.export(_Step().eval(), (q, past_k, new_k, past_v, new_v, mask,
                                                   counts, positions))
    with dependent_launch.dependent_launches() as dependent:
        assert dependent
        path, source = compile_library(program, tmp_path / "s.pt2")
    loaded = set(re.findall(r'loadKernel\(\s*(?:"[^"]*"|\w+)\s*,\s*"(\w+)"', source))
    assert loaded == {"attention_store_kernel_gdc"}, loaded
    assert not copy_calls(source)
