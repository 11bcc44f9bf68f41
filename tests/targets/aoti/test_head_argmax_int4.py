"""The head's token kernel over int4 rows (kernels/head_argmax_triton.py's int4 form:
int4_triton.py's product, the same key epilogue): the logits are reference.row_gemv's
over the unpacked rows, the token is torch.argmax of the logits returned (ties: the
first), the slot is back at zero, and the advancing form feeds the step's inputs. Under
``TRITON_INTERPRET=1`` or on a GPU; the CUDA graph and the library on a Hopper GPU only
(marked cuda)."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels import int4_rows, reference
from tests.helpers import triton_device
from tests.targets.aoti.aoti_library import compile_library, load_library

pytest.importorskip("triton")


def _head(device, rows=201, cols=256, group=128, dtype=torch.float16, seed=5, tie=None):
    """x, the head's int4 rows (packed, pairs), a norm weight; ``tie``: (row, copied
    row), the second's float row the first's before packing."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 1, cols, generator=g).to(device, dtype)
    w = torch.randn(rows, cols, generator=g) * 0.1
    if tie:
        w[tie[1]] = w[tie[0]]
    packed, scales = int4_rows.pack(w.to(dtype), group)
    norm = (torch.rand(cols, generator=g) + 0.5).to(device, dtype)
    return x, packed.to(device), scales.to(device), norm


CONFIG = (8, 2, 4, False)  # 8 rows a program (fewer programs under the interpreter)


def _launch(x, packed, scales, norm, config=CONFIG, **given):
    from targets.aoti.kernels.head_argmax_triton import launch_head_argmax
    return launch_head_argmax(x, packed, None, norm, 1e-5, 0.0, scales, config, **given)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("cols,group,config", [
    (256, 128, None),            # int4_config's choice (2 rows a program, one step)
    (512, 64, (8, 2, 4, False)),  # 8 groups, 2 a step: the tiles ahead in the loop
    (512, 32, (8, 4, 4, True)),  # x split into a word's byte columns
])
def test_the_token_is_the_argmax_of_the_int4_logits(cols, group, config, dtype):
    device = triton_device()
    x, packed, scales, norm = _head(device, cols=cols, group=group, dtype=dtype)
    from targets.aoti.kernels.head_argmax_triton import argmax_slot
    slot = argmax_slot(device)
    logits, token = _launch(x, packed, scales, norm, config, slot=slot)
    want = reference.row_gemv(x.cpu(), packed.cpu(), None, norm.cpu(), None, 1e-5, 0.0, 0,
                              scales.cpu())
    tolerance = 2e-3 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(logits.cpu().float(), want.float(), rtol=tolerance,
                               atol=tolerance)
    assert int(token) == int(logits.reshape(-1).argmax())
    assert slot.tolist() == [0]


def test_equal_rows_give_the_first():
    device = triton_device()
    x, packed, scales, norm = _head(device)
    top = int(_launch(x, packed, scales, norm)[1])
    for copy in {top - 1 if top % 8 else top + 1, (top + 100) % 201}:  # same block; another
        tied = _head(device, tie=(top, copy))
        logits, token = _launch(*tied)
        assert int(token) == min(top, copy) == int(logits.reshape(-1).argmax())


def test_a_bias_and_the_advancing_form():
    """A biased head (the op's other argument), and the token kernel writing the token
    into the step's ids and the next position, three calls on one slot."""
    device = triton_device()
    x, packed, scales, norm = _head(device)
    bias = torch.linspace(-0.5, 0.5, 201).to(device, x.dtype)
    from targets.aoti.kernels.head_argmax_triton import argmax_slot, launch_head_argmax
    slot = argmax_slot(device)
    ids = torch.zeros(1, dtype=torch.int64, device=device)
    positions = torch.tensor([10], device=device)
    for step in range(3):
        x = x.roll(step, dims=-1)
        logits, token = launch_head_argmax(x, packed, bias, norm, 1e-5, 0.0, scales,
                                           CONFIG, slot=slot, advance=(ids, positions))
        want, _ = reference.row_gemv_argmax(x.cpu(), packed.cpu(), bias.cpu(), norm.cpu(),
                                            1e-5, 0.0, scales.cpu())
        torch.testing.assert_close(logits.cpu().float(), want.float(), rtol=2e-2,
                                   atol=2e-2)
        assert int(token) == int(logits.reshape(-1).argmax()) == int(ids)
        assert positions.tolist() == [11 + step] and slot.tolist() == [0]


def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("dependent launches need a Hopper GPU")


@pytest.mark.cuda
def test_dependent_int4_heads_in_a_row_share_one_slot_in_a_cuda_graph():
    """Three dependent launches at the ~1.1B's head shape over int4 rows (32,000 x
    2,048 in groups of 128, norm folded), each with its token kernel, one slot,
    captured and replayed: each token its own logits' argmax, the logits the
    reference's."""
    _hopper()
    from targets.aoti.kernels.head_argmax_triton import argmax_slot
    x, packed, scales, norm = _head("cuda", rows=32000, cols=2048, seed=3)
    xs = [x.roll(i, dims=-1).contiguous() for i in range(3)]
    slot = argmax_slot("cuda")
    tokens = [torch.zeros(1, dtype=torch.int64, device="cuda") for _ in xs]

    def heads():
        return [_launch(each, packed, scales, norm, None, pdl=True, slot=slot,
                        token=token)[0]
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
    want = reference.row_gemv(xs[0], packed, None, norm, None, 1e-5, 0.0, 0, scales)
    torch.testing.assert_close(outs[0].float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.cuda
def test_a_library_takes_the_token_in_its_int4_head_kernel(tmp_path):
    """row_gemv_argmax over int4 rows compiled by AOTInductor inside
    dependent_launches(): each call's token is its logits' argmax, and the library loads
    the int4 head's and the token's ``_gdc`` kernels and the slot's fill only."""
    _hopper()
    import re

    from targets.aoti.kernels import dependent_launch, ops
    _, packed, scales, norm = _head("cuda", rows=3000)

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("packed", packed)
            self.register_buffer("scales", scales)
            self.register_buffer("norm", norm)

        def forward(self, x):
            return ops.row_gemv_argmax(x, self.packed, None, self.norm, 1e-5, 0.0,
                                       self.scales)

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
    fills = {name for name in loaded if "zeros" in name or "full" in name}
    assert loaded - fills == {"int4_head_argmax_kernel_gdc", "slot_token_kernel_gdc"}, loaded
    assert len(fills) <= 1, loaded
