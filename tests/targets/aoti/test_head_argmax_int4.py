"""The head's token kernel over int4 rows (kernels/head_argmax_triton.py's int4 form:
int4_triton.py's product, the same key epilogue), what only int4 rows have: groups of
32/64/128 and int4_config's shapes, the logits reference.row_gemv's over the unpacked
rows, the token torch.argmax of the logits returned, the slot back at zero; a biased head
and the advancing form. Under ``TRITON_INTERPRET=1`` or on a GPU. Ties, the CUDA graph
and the library over each width: test_head_argmax.py."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels import reference
from tests.helpers import triton_device
from tests.targets.aoti.weight_rows import rows_of

pytest.importorskip("triton")

from tests.targets.aoti.test_head_argmax import _head as _float_head  # noqa: E402


def _head(device, rows=201, cols=256, group=128, dtype=torch.float16, seed=5):
    """x, the head's int4 rows (packed, pairs) and a norm weight: test_head_argmax.py's
    float head, packed."""
    x, w, norm = _float_head(device, rows, cols, dtype, seed)
    return x, *rows_of(w, "int4", dtype, device, group), norm


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
