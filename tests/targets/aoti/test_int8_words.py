"""int8_words_triton.py: int8 rows read as int32 words, each weight made fp32 by a byte
permute and a subtract, against reference.row_gemv over every fold (norm, gate, bias,
rotary rows, residual), and launch_row_gemv choosing it for int8 rows in the one-block
shape. Under TRITON_INTERPRET=1 on the CPU, or on a GPU."""

from __future__ import annotations

import struct

import pytest
import torch

from tests.helpers import triton_device

pytest.importorskip("triton")


def _prmt(a: int, b: int, selector: int) -> int:
    """PTX prmt.b32's default mode: result byte i is byte (selector nibble i) of b:a."""
    pool = (b << 32 | a).to_bytes(8, "little")
    return int.from_bytes(bytes(pool[selector >> 4 * i & 7] for i in range(4)), "little")


def test_every_byte_becomes_its_exact_float_in_both_forms():
    """A word's byte k (an int8 weight), with its sign bit flipped, under the exponent of
    2^23, less 2^23 + 128: the weight exactly; the permute (the GPU's form) and the
    shifts and masks (the interpreter's) give the same bits."""
    for byte in range(256):
        value = byte - 256 if byte >= 128 else byte
        for k in range(4):
            word = (0x5A << 8 * ((k + 1) % 4) | byte << 8 * k) & 0xFFFFFFFF
            shifted = ((word >> 8 * k) & 0xFF) ^ 0x4B000080
            permuted = _prmt(word ^ 0x80808080, 0x4B000000, 0x7650 + k)
            assert shifted == permuted
            as_float = struct.unpack("<f", struct.pack("<I", shifted))[0]
            assert as_float - 8388736.0 == value


def _made(*size, seed, scale=1.0, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(size, generator=generator) * scale).to(device, torch.float16)


def test_integer_sums_are_exact_through_the_library_launch():
    """Every byte value in each row, x small integers, scale 1: every sum an exact
    integer, so a byte lost, moved to another column or read with the wrong sign differs
    from the float64 product; launch_row_gemv's own int8 path gives the same sums."""
    device = triton_device()
    from targets.aoti.kernels.int8_words_triton import launch_int8_words
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    cols = torch.arange(256, device=device)
    weight = ((torch.arange(24, device=device)[:, None] * 37 + 11 * cols) % 256 - 128)
    weight = weight.to(torch.int8)
    scale = torch.ones(24, device=device)
    x = (1 + cols % 5 + 3 * (cols >= 128)).float().reshape(1, 1, 256)
    want = weight.double() @ x.double().reshape(-1)
    for config in [(4, 64, 4, 0), (2, 128, 4, 64), (8, 64, 4, 256)]:
        got = launch_int8_words(x, weight, None, None, None, 1e-6, 0.0, 0, scale, config)
        assert torch.equal(got.double().reshape(-1), want), config
    library = launch_row_gemv(x, weight, None, None, None, 1e-6, 0.0, 0, (4, 64, 4, 0),
                              weight_scale=scale)
    assert torch.equal(library.double().reshape(-1), want)


def operands(n, k, act, norm, res, bias, device, low=-128):
    """(x, int8 rows, their scales, norm weight, residual, bias) of a product of ``n``
    outputs (two halves where ``act``) over ``k`` columns; the folds where asked."""
    rows = 2 * n if act else n
    generator = torch.Generator().manual_seed(6)
    weight = torch.randint(low, 128, (rows, k), generator=generator, dtype=torch.int8)
    scale = (torch.rand(rows, generator=generator) * 2e-2 + 1e-2).half()
    x = _made(1, 1, k, seed=1, device=device)
    nw = _made(k, seed=2, scale=0.1, device=device) + 1.0 if norm else None
    r = _made(1, 1, n, seed=3, device=device) if res else None
    b = _made(rows, seed=4, device=device) if bias else None
    return x, weight.to(device), scale.to(device), nw, r, b


@pytest.mark.parametrize("n, k, act, norm, res, bias, config", [
    (40, 96, 1, True, False, False, (4, 64, 4, 0)),  # gate/up: the norm, a masked tile
    (36, 128, 0, True, False, True, (4, 64, 4, 128)),  # q/k/v with bias, all ahead
    (40, 128, 0, True, False, False, (8, 64, 4, 64)),  # head: the first tile ahead
    (41, 64, 0, False, True, False, (4, 32, 4, 0)),  # a residual, a part block
    (24, 64, 1, True, True, True, (4, 64, 2, 32)),  # gated, columns ahead, bias, residual
])
def test_int8_words_are_row_gemvs(n, k, act, norm, res, bias, config):
    device = triton_device()
    from targets.aoti.kernels.int8_words_triton import launch_int8_words
    from targets.aoti.kernels.reference import row_gemv
    x, weight, scale, nw, r, b = operands(n, k, act, norm, res, bias, device)
    got = launch_int8_words(x, weight, b, nw, r, 1e-5, 0.0, act, scale, config)
    want = row_gemv(x, weight, b, nw, r, 1e-5, 0.0, act, scale)
    error = (got.float() - want.float()).abs().max().item()
    assert error <= 2e-3 * max(1.0, want.float().abs().max().item()), error


def test_rotary_rows_through_the_library_launch_are_row_gemvs():
    """q/k/v's rotary rows (pairs half a head apart in one program) over int8 words, as
    launch_row_gemv gives them: the reference's rotated rows, unlike the unrotated."""
    device = triton_device()
    from targets.aoti.kernels.reference import row_gemv
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    heads, kv_heads, dim, k = 2, 1, 16, 64
    rotated = (heads + kv_heads) * dim
    generator = torch.Generator().manual_seed(3)
    weight = torch.randint(-127, 128, (rotated + kv_heads * dim, k), generator=generator,
                           dtype=torch.int8).to(device)
    scale = torch.full((weight.shape[0],), 1e-2, dtype=torch.float16, device=device)
    x = _made(1, 1, k, seed=5, device=device)
    angle = 9.0 / 10000 ** (torch.arange(0, dim, 2) / dim)
    cos, sin = (f(torch.cat([angle, angle])).half().view(1, 1, 1, dim).to(device)
                for f in (torch.cos, torch.sin))
    args = (None, _made(k, seed=2, scale=0.1, device=device) + 1.0, None, 1e-6, 0.0, 0)
    turn = dict(rotary_cos=cos, rotary_sin=sin, rotary_rows=rotated, head_dim=dim)
    want = row_gemv(x, weight, *args, weight_scale=scale, **turn).float()
    assert not torch.allclose(want, row_gemv(x, weight, *args, weight_scale=scale).float())
    for config in (None, (4, 32, 4, 0), (8, 32, 4, 64)):
        got = launch_row_gemv(x, weight, *args, config=config, weight_scale=scale, **turn)
        assert ((got.float() - want).norm() / want.norm()).item() < 2e-3, config


def test_rows_that_are_not_whole_words_are_refused():
    from targets.aoti.kernels.int8_words_triton import launch_int8_words, words_fit
    scale = torch.ones(8, dtype=torch.float16)
    assert not words_fit(torch.zeros(8, 62, dtype=torch.int8), (4, 64, 4, 0))
    assert not words_fit(torch.zeros(8, 64, dtype=torch.float16), (4, 64, 4, 0))
    assert words_fit(torch.zeros(8, 64, dtype=torch.int8), (4, 64, 4, 0))
    with pytest.raises(ValueError, match="whole words"):
        launch_int8_words(torch.zeros(1, 1, 62), torch.zeros(8, 62, dtype=torch.int8), None,
                          None, None, 1e-6, 0.0, 0, scale, (4, 64, 4, 0))
