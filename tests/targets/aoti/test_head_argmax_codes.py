"""head_argmax_triton.py over int8 rows against x's int8 codes (``x_qblock``): the
logits are reference.row_gemv_argmax's with x quantized as it says, the token their
argmax; rows that are not whole blocks are refused. Under TRITON_INTERPRET=1 on the
CPU, or on a GPU."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import triton_device

pytest.importorskip("triton")


@pytest.mark.parametrize("config", [None, (4, 64, 4, 0), (8, 32, 4, 128)])
def test_the_heads_logits_and_token_over_x_codes(config):
    device = triton_device()
    from targets.aoti.kernels.head_argmax_triton import launch_head_argmax
    from targets.aoti.kernels.reference import row_gemv_argmax
    generator = torch.Generator().manual_seed(4)
    weight = torch.randint(-127, 128, (300, 128), generator=generator, dtype=torch.int8)
    scale = (torch.rand(300, generator=generator) * 2e-2 + 1e-2).half()
    x = torch.randn(1, 1, 128, generator=generator).half()
    norm = (torch.randn(128, generator=generator) * 0.1 + 1.0).half()
    weight, scale, x, norm = (t.to(device) for t in (weight, scale, x, norm))
    logits, token = launch_head_argmax(x, weight, None, norm, 1e-5, 0.0, scale, config,
                                       x_qblock=32)
    want, _ = row_gemv_argmax(x, weight, None, norm, 1e-5, 0.0, scale, x_qblock=32)
    top = want.float().abs().max().item()
    assert (logits.float() - want.float()).abs().max().item() <= 2e-3 * max(1.0, top)
    assert int(token) == int(logits.reshape(-1).float().argmax())


def test_rows_that_are_not_whole_blocks_are_refused():
    from targets.aoti.kernels.head_argmax_triton import launch_head_argmax
    with pytest.raises(ValueError, match="blocks of 32"):
        launch_head_argmax(torch.zeros(1, 1, 48), torch.zeros(8, 48, dtype=torch.int8),
                           None, None, 1e-5, 0.0, torch.ones(8), x_qblock=32)
