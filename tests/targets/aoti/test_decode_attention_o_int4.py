"""The attention + o launch over int4 o rows (kernels/attention_o_triton.py, GROUP > 0:
int4_triton.py's tiles and loop in o's programs), what only int4 rows have: groups of
32/64/128, o's columns in one, two and four steps, against reference.decode_attention_o
over the int4 rows (reference.row_gemv unpacks them), and pairs of another shape refused.
Under ``TRITON_INTERPRET=1`` or on a GPU. The store form, the flags handed on, the CUDA
graph and the library over each width: test_decode_attention_o.py and
test_decode_attention_o_store.py."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels import reference
from targets.aoti.kernels.attention_o_slots import STRIDE
from tests.helpers import triton_device
from tests.targets.aoti.test_decode_attention_o_store import _launch, _o_rows, _state
from tests.targets.aoti.test_decode_attention_store import _inputs

pytest.importorskip("triton")


def _want(attention, o):
    packed, scales, residual = o
    return reference.decode_attention_o(
        *(t.cpu() if isinstance(t, torch.Tensor) else t for t in attention), True, None,
        packed.cpu(), scales.cpu(), residual.cpu(), None, 0, 0)


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
    o = _o_rows(device, rows, shape[0] * shape[3], dtype, "int4", group=group)
    counts, flags = _state(device, shape[1])
    flags[STRIDE] = 7  # the slot this launch zeroes
    got = _launch(attention, o, counts, flags)
    tolerance = 2e-3 if dtype == torch.float32 else 2e-2
    assert got.shape == (1, 1, rows) and got.dtype == dtype
    torch.testing.assert_close(got.cpu().float(), _want(attention, o).float(),
                               rtol=tolerance, atol=tolerance)
    assert not counts.any()
    assert flags[0].item() == shape[1] and flags[STRIDE].item() == 0


def test_pairs_of_another_shape_are_refused():
    device = triton_device()
    *attention, _ = _inputs((4, 2, 16, 16), torch.float32, device, 3)
    packed, scales, residual = _o_rows(device, 8, 64, torch.float32, "int4", group=32)
    counts, flags = _state(device, 2)
    with pytest.raises(ValueError, match="pairs"):
        _launch(attention, (packed, scales[:4], residual), counts, flags)
    with pytest.raises(ValueError, match="not joined"):  # 64 columns, packed as 32
        _launch(attention, (packed[:, :16], scales, residual), counts, flags)
