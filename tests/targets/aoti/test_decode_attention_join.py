"""The decode attention's join inside its split kernel (kernels/decode_attention.py, given
counts): the reference math over grouped heads, dtypes and cache lengths, one counts
buffer for several calls. On a GPU, or on the CPU under ``TRITON_INTERPRET=1``."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels import reference
from tests.helpers import triton_device

pytest.importorskip("triton")


def _inputs(shape, dtype, device, seed):
    heads, kv_heads, slots, dim = shape
    generator = torch.Generator().manual_seed(seed)

    def made(*size):
        return torch.randn(size, generator=generator).to(device=device, dtype=dtype)
    q = made(1, heads, 1, dim)
    past_k, past_v = made(1, kv_heads, slots, dim), made(1, kv_heads, slots, dim)
    new_k, new_v = made(1, kv_heads, 1, dim), made(1, kv_heads, 1, dim)
    mask = torch.zeros(1, 1, 1, slots + 1, device=device, dtype=dtype)
    mask[..., slots // 2:slots] = torch.finfo(dtype).min  # slots not yet written
    return q, past_k, new_k, past_v, new_v, mask, dim ** -0.5


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [  # (H, KVH, S, D): groups of 1, 4 and 8
    (4, 4, 17, 16), (8, 2, 100, 80), (32, 4, 600, 64), (8, 1, 33, 64)])
def test_joined_attention_matches_its_reference_and_leaves_the_counts_at_zero(shape, dtype):
    """Two calls (another shape's inputs between) on one counts buffer, longer than the
    key/value heads as the step's shared one may be: each the reference math, as the
    split + combine kernels, and the counts back at zero after each."""
    from targets.aoti.kernels.decode_attention import launch_decode_attention
    device = triton_device()
    counts = torch.zeros(shape[1] + 3, device=device, dtype=torch.int32)
    bound = 2e-3 if dtype == torch.float16 else 1e-5
    for seed in (0, 1):
        args = _inputs(shape, dtype, device, seed)
        want = reference.decode_attention(*args).float()
        got = launch_decode_attention(*args, counts=counts)
        assert got.dtype == dtype and got.shape == want.shape
        assert ((got.float() - want).norm() / want.norm()).item() < bound
        assert not counts.any()
        apart = launch_decode_attention(*args).float()
        assert ((got.float() - apart).norm() / apart.norm()).item() < bound
