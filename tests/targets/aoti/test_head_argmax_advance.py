"""The head's token kernel that also feeds a greedy step's next inputs back
(kernels/head_argmax_triton.py's ``advance``, the row_gemv_argmax_advance op): the token
written into the step's input ids, one added to its position, the slot back at zero,
the token still the argmax of the logits returned. On the CPU under
``TRITON_INTERPRET=1`` or on a GPU; the CUDA-graph and library tests on a Hopper GPU."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import triton_device
from tests.targets.aoti.aoti_library import compile_library, load_library

pytest.importorskip("triton")

HIDDEN = 64
CONFIG = (8, 32, 4, 16)  # 8 rows a program; 201 rows: the last block part-filled


def _head(device, rows=201, dtype=torch.float16, seed=5):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 1, HIDDEN, generator=generator).to(device, dtype)
    w = (torch.randn(rows, HIDDEN, generator=generator) * 0.1).to(device, dtype)
    norm = (torch.rand(HIDDEN, generator=generator) + 0.5).to(device, dtype)
    return x, w, norm


def _inputs(device, token=7, position=9):
    return (torch.full((1, 1), token, dtype=torch.int64, device=device),
            torch.full((1,), position, dtype=torch.int64, device=device))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_the_token_goes_into_the_input_ids_and_the_position_advances(dtype):
    from targets.aoti.kernels.head_argmax_triton import argmax_slot, launch_head_argmax
    device = triton_device()
    slot = argmax_slot(device)
    ids, positions = _inputs(device)
    for seed, position in zip(range(3), (10, 11, 12)):
        x, w, norm = _head(device, dtype=dtype, seed=seed)
        logits, token = launch_head_argmax(x, w, None, norm, 1e-5, 0.0, None, CONFIG,
                                           slot=slot, advance=(ids, positions))
        assert int(token) == int(logits.reshape(-1).argmax())
        assert ids.tolist() == [[int(token)]] and positions.tolist() == [position]
        assert slot.tolist() == [0]


def test_the_plain_token_kernel_leaves_the_inputs_alone():
    from targets.aoti.kernels.head_argmax_triton import launch_head_argmax
    device = triton_device()
    ids, positions = _inputs(device)
    x, w, norm = _head(device)
    launch_head_argmax(x, w, None, norm, 1e-5, 0.0, None, CONFIG)
    assert ids.tolist() == [[7]] and positions.tolist() == [9]


def test_the_op_advances_as_its_reference_does():
    from targets.aoti.kernels import ops, reference
    device = triton_device()
    x, w, norm = _head(device)
    ids, positions = _inputs(device)
    ref_ids, ref_positions = _inputs("cpu")
    logits, token = ops.row_gemv_argmax_advance(x, w, None, norm, 1e-5, 0.0, None, ids,
                                                positions)
    want, want_token = reference.row_gemv_argmax_advance(
        x.cpu().float(), w.cpu().float(), None, norm.cpu().float(), 1e-5, 0.0, None,
        ref_ids, ref_positions)
    torch.testing.assert_close(logits.cpu().float(), want, rtol=1e-2, atol=1e-2)
    assert ids.cpu().tolist() == [[int(token)]] and positions.cpu().tolist() == [10]
    assert ref_positions.tolist() == [10] and ref_ids.tolist() == [[int(want_token)]]


def test_bad_inputs_to_advance_are_refused():
    from targets.aoti.kernels.head_argmax_triton import launch_head_argmax
    device = triton_device()
    x, w, norm = _head(device)
    ids, positions = _inputs(device)
    with pytest.raises(ValueError, match="positions"):
        launch_head_argmax(x, w, None, norm, 1e-5, 0.0, None,
                           advance=(ids, positions.int()))
    with pytest.raises(ValueError, match="input ids"):
        launch_head_argmax(x, w, None, norm, 1e-5, 0.0, None,
                           advance=(torch.zeros(1, 2, dtype=torch.int64, device=device),
                                    positions))


def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("dependent launches need a Hopper GPU")


class _Step(torch.nn.Module):
    """A greedy step's ends as a decode step has them: its input ids and position read
    first (the embedding, a position-scaled row), the head's token fed back last."""

    def __init__(self, rows: int, hidden: int):
        super().__init__()
        generator = torch.Generator().manual_seed(1)
        self.register_buffer("table", torch.randn(rows, hidden, generator=generator).to(
            "cuda", torch.float16))
        self.register_buffer("weight", (torch.randn(rows, hidden, generator=generator)
                                        * 0.05).to("cuda", torch.float16))
        self.register_buffer("norm", (torch.rand(hidden, generator=generator) + 0.5).to(
            "cuda", torch.float16))

    def row(self, ids, positions):
        return self.table[ids] * (1.0 + positions.reshape(1, 1, 1).to(torch.float16) * 0.01)

    def forward(self, ids, positions):
        from targets.aoti.kernels import ops
        return ops.row_gemv_argmax_advance(self.row(ids, positions), self.weight, None,
                                           self.norm, 1e-5, 0.0, None, ids, positions)

    def reference(self, token: int, position: int) -> int:
        """The token eager float math gives after ``token`` at ``position``."""
        from targets.aoti.kernels import reference
        x = self.row(*_inputs("cuda", token, position)).float()
        logits = reference.row_gemv(x, self.weight.float(), None, self.norm.float(), None,
                                    1e-5, 0.0, 0)
        return int(logits.reshape(-1).argmax())


@pytest.mark.cuda
def test_a_cuda_graph_of_dependent_steps_feeds_each_token_back():
    """The step above, its head a dependent launch, captured once and replayed as the
    greedy loop does (nothing written between replays): each replay reads the token and
    position the one before wrote, at the ~1.1B head's shape."""
    _hopper()
    from targets.aoti.kernels.head_argmax_triton import argmax_slot, launch_head_argmax
    step = _Step(32000, 2048)
    ids, positions = _inputs("cuda", 5, 100)
    slot = argmax_slot("cuda")
    tokens = torch.zeros(1, dtype=torch.int64, device="cuda")

    def run():
        return launch_head_argmax(step.row(ids, positions), step.weight, None, step.norm,
                                  1e-5, 0.0, None, pdl=True, slot=slot, token=tokens,
                                  advance=(ids, positions))[0]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = run()
    ids.fill_(5)
    positions.fill_(100)
    for position in range(100, 106):
        token = int(ids)
        graph.replay()
        torch.cuda.synchronize()
        assert int(tokens) == int(logits.reshape(-1).argmax()) == int(ids)
        assert int(positions) == position + 1 and slot.tolist() == [0]
        want = step.reference(token, position)
        assert int(ids) == want or _near_tie(logits, want)


def _near_tie(logits, other: int) -> bool:
    """Whether the reference's choice is within a few fp16 roundings of the kernel's
    maximum (logits near 10: an fp16 step of 0.008)."""
    flat = logits.reshape(-1).float()
    return bool(flat.max() - flat[other] < 0.05)


@pytest.mark.cuda
def test_a_library_feeds_its_inputs_back_in_place_call_after_call(tmp_path):
    """The op compiled by AOTInductor inside dependent_launches(), as the decode pass
    places it (the step's inputs read first, then written by the token kernel): the
    library loads the head's and the advancing token kernel's ``_gdc`` forms besides
    its own pointwise kernels, calls no copy, and the caller's tensors hold the token
    and the next position after each call."""
    _hopper()
    import re

    from bench.library_kernels import copy_calls
    from targets.aoti.kernels import dependent_launch
    step = _Step(3000, 256).eval()
    ids, positions = _inputs("cuda", 5, 40)
    program = torch.export.export(step, (ids.clone(), positions.clone()))
    with dependent_launch.dependent_launches() as dependent:
        assert dependent
        path, source = compile_library(program, tmp_path / "a.pt2")
    loaded = set(re.findall(r'loadKernel\(\s*(?:"[^"]*"|\w+)\s*,\s*"(\w+)"', source))
    ours = {name for name in loaded if not name.startswith("triton_")}
    assert ours == {"head_argmax_kernel_gdc", "slot_token_advance_kernel_gdc"}, loaded
    assert not copy_calls(source)
    run = load_library(path)
    for position in range(40, 44):
        token = int(ids)
        logits, given = run(ids, positions)
        assert int(given) == int(logits.reshape(-1).argmax()) == int(ids)
        assert int(positions) == position + 1
        want = step.reference(token, position)
        assert int(ids) == want or _near_tie(logits, want)
