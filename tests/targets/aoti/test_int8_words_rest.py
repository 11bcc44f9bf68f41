"""int8 rows read as int32 words (int8_words_triton.py's pieces) in the kernels beyond the
one-block rows, each behind its WORDS constexpr: down's split along K
(split_gemv_triton.py), o's rows in the attention + o launch (attention_o_triton.py) and
the head with its token (head_argmax_triton.py). Exact integer sums with every byte value
in every row, the folds against the references, and words_chosen (off by default; the
environment names kernels for an A/B build). Under TRITON_INTERPRET=1 on the CPU, or on
a GPU."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels import reference
from tests.helpers import triton_device

pytest.importorskip("triton")


def _every_byte(rows: int, cols: int, device) -> torch.Tensor:
    """int8 rows in which each run of 256 columns holds every byte value once, each row
    in its own order (a byte read from another column or row changes the sum)."""
    at = torch.arange(cols, device=device)
    made = (torch.arange(rows, device=device)[:, None] * 37 + 11 * at) % 256 - 128
    return made.to(torch.int8)


def _small_x(cols: int, device) -> torch.Tensor:
    """float32 x of small integers, so every fp32 sum of int8 weights times x is exact."""
    at = torch.arange(cols, device=device)
    return (1 + at % 5 - 3 * (at % 7 == 3)).float().reshape(1, 1, cols)


SPLITS = [  # (BLOCK_N, BLOCK_K, warps, AHEAD, SPLIT), columns
    ((8, 512, 4, 512, 11), 5632),  # the library's down shape, whole parts held
    ((4, 32, 4, 64, 2), 296),  # a part's rest in a loop of tiles, the last one masked
    ((2, 16, 4, 32, 4), 80),  # parts of 20 columns in the 32 held: masked by the part's end
    ((4, 16, 4, 32, 5), 256),  # parts of 52 and a short last part (48)
]


@pytest.mark.parametrize("config, cols", SPLITS)
def test_split_words_sums_are_exact(config, cols):
    """Every byte value in each row, x and the residual small integers, scale 1: each
    part's sum and the join exact, so they equal the float64 product, as the I2F form's
    do; the counters left at zero."""
    device = triton_device()
    from targets.aoti.kernels.split_gemv_triton import launch_split_gemv, split_counters
    weight = _every_byte(19, cols, device)
    x, scale = _small_x(cols, device), torch.ones(19, device=device)
    residual = torch.arange(-9, 10, device=device).float().reshape(1, 1, 19)
    want = weight.double() @ x.double().reshape(-1) + residual.double().reshape(-1)
    counts = split_counters(weight, config)
    for words in (True, False):
        got = launch_split_gemv(x, weight, None, residual, counts, config, False, scale,
                                words=words)
        assert torch.equal(got.double().reshape(-1), want), (config, words)
        assert not counts.any()


def test_split_words_with_scales_bias_and_residual_are_row_gemvs():
    device = triton_device()
    from targets.aoti.kernels.split_gemv_triton import launch_split_gemv, split_counters
    generator = torch.Generator().manual_seed(4)
    n, k, config = 40, 384, (4, 64, 4, 64, 3)
    weight = torch.randint(-128, 128, (n, k), generator=generator, dtype=torch.int8)
    scale = (torch.rand(n, generator=generator) * 2e-2 + 1e-2).half()
    x = torch.randn(1, 1, k, generator=generator).half()
    bias, residual = torch.randn(n, generator=generator).half(), torch.randn(
        1, 1, n, generator=generator).half()
    weight, scale, x, bias, residual = (t.to(device) for t in (weight, scale, x, bias,
                                                                 residual))
    want = reference.row_gemv(x, weight, bias, None, residual, 1e-6, 0.0, 0, scale)
    got = launch_split_gemv(x, weight, bias, residual, split_counters(weight, config),
                            config, False, scale, words=True)
    error = (got.float() - want.float()).abs().max().item()
    assert error <= 2e-3 * max(1.0, want.float().abs().max().item()), error


def test_split_words_refuses_parts_that_are_not_whole_words():
    from targets.aoti.kernels.split_gemv_triton import (launch_split_gemv, split_counters,
                                                        split_words_fit)
    weight, scale = torch.zeros(8, 66, dtype=torch.int8), torch.ones(8)
    assert not split_words_fit(weight, scale, (4, 16, 4, 32, 3))  # parts of 22 columns
    assert not split_words_fit(weight.half(), scale, (4, 16, 4, 32, 2))
    assert not split_words_fit(weight, None, (4, 16, 4, 32, 2))
    assert split_words_fit(torch.zeros(8, 64, dtype=torch.int8), scale, (4, 16, 4, 32, 2))
    with pytest.raises(ValueError, match="whole words"):
        launch_split_gemv(torch.zeros(1, 1, 66), weight, None, None,
                          split_counters(weight, (4, 16, 4, 32, 3)), (4, 16, 4, 32, 3),
                          weight_scale=scale, words=True)


def test_words_are_off_by_default_and_the_environment_names_kernels(monkeypatch):
    from targets.aoti.kernels.int8_words_triton import WORDS_ENV, WORDS_KERNELS, words_chosen
    monkeypatch.delenv(WORDS_ENV, raising=False)
    assert not any(words_chosen(kernel) for kernel in WORDS_KERNELS)
    monkeypatch.setenv(WORDS_ENV, "split, head")
    assert [words_chosen(kernel) for kernel in WORDS_KERNELS] == [True, False, True, False]
    monkeypatch.setenv(WORDS_ENV, "")
    assert not any(words_chosen(kernel) for kernel in WORDS_KERNELS)
    monkeypatch.setenv(WORDS_ENV, "split,down")
    with pytest.raises(ValueError, match="among split, attention_o, head"):
        words_chosen("split")


def test_the_splits_default_is_words_chosen(monkeypatch):
    """launch_split_gemv without ``words`` asks words_chosen("split") (the sums exact
    either way: the words form's own test is above)."""
    device = triton_device()
    from targets.aoti.kernels import split_gemv_triton
    seen = []
    monkeypatch.setattr(split_gemv_triton, "words_chosen",
                        lambda kernel: seen.append(kernel) or True)
    weight, x = _every_byte(8, 128, device), _small_x(128, device)
    config = (4, 32, 4, 64, 2)
    got = split_gemv_triton.launch_split_gemv(
        x, weight, None, None, split_gemv_triton.split_counters(weight, config), config,
        False, torch.ones(8, device=device))
    assert seen == ["split"]
    assert torch.equal(got.double().reshape(-1), weight.double() @ x.double().reshape(-1))


HEADS = [  # (rows, columns, config (BLOCK_N, BLOCK_K, warps, AHEAD))
    (40, 256, (8, 64, 4, 64)),  # the first tile held, the rest in a loop
    (37, 256, (4, 128, 4, 0)),  # nothing held, a part block
]


@pytest.mark.parametrize("n, k, config", HEADS)
def test_head_words_logits_are_exact_and_the_token_their_argmax(n, k, config):
    """Every byte value in each row, x small integers, scale 1, no norm: the logits equal
    the float64 product, as the I2F form's do, and the token is their argmax."""
    device = triton_device()
    from targets.aoti.kernels.head_argmax_triton import launch_head_argmax
    weight, x = _every_byte(n, k, device), _small_x(k, device)
    want = weight.double() @ x.double().reshape(-1)
    for words in (True, False):
        logits, token = launch_head_argmax(x, weight, None, None, 1e-6, 0.0,
                                           torch.ones(n, device=device), config,
                                           words=words)
        assert torch.equal(logits.double().reshape(-1), want), (config, words)
        assert int(token) == int(want.argmax()), words


def test_head_words_with_the_norm_are_the_reference():
    device = triton_device()
    from targets.aoti.kernels.head_argmax_triton import launch_head_argmax
    generator = torch.Generator().manual_seed(8)
    n, k = 64, 128
    weight = torch.randint(-128, 128, (n, k), generator=generator, dtype=torch.int8)
    scale = (torch.rand(n, generator=generator) * 2e-2 + 1e-2).half()
    x = torch.randn(1, 1, k, generator=generator).half()
    norm = (torch.rand(k, generator=generator) + 0.5).half()
    weight, scale, x, norm = (t.to(device) for t in (weight, scale, x, norm))
    logits, token = launch_head_argmax(x, weight, None, norm, 1e-5, 0.0, scale,
                                       (8, 32, 4, 64), words=True)
    want, _ = reference.row_gemv_argmax(x, weight, None, norm, 1e-5, 0.0, scale)
    error = (logits.float() - want.float()).abs().max().item()
    assert error <= 2e-3 * max(1.0, want.float().abs().max().item()), error
    assert int(token) == int(logits.reshape(-1).argmax())


def _one_slot_layer(device, rows, store):
    """A layer whose attention is exactly one past slot's values: every other slot and
    the new row masked (softmax 1 and 0s), fp32, the values small integers; o's rows
    every byte value, scale 1, an integer residual. (its launch's arguments, o's want)"""
    heads, kv_heads, slots, dim = 4, 2, 32, 16
    generator = torch.Generator().manual_seed(2)
    query = torch.randn(1, heads, 1, dim, generator=generator)
    past_k = torch.randn(1, kv_heads, slots, dim, generator=generator)
    past_v = torch.randint(-3, 4, (1, kv_heads, slots, dim), generator=generator).float()
    new_k, new_v = torch.randn(1, kv_heads, 1, dim), torch.randn(1, kv_heads, 1, dim)
    mask = torch.full((1, 1, 1, slots + 1), float("-inf"))
    mask[..., 9] = 0.0
    weight = _every_byte(rows, heads * dim, "cpu")
    residual = torch.arange(rows).float().reshape(1, 1, rows) - 20
    att = past_v[0, :, 9].repeat_interleave(heads // kv_heads, 0).reshape(-1)
    want = weight.double() @ att.double() + residual.double().reshape(-1)
    from targets.aoti.kernels.attention_o_slots import SLOTS, STRIDE
    made = [t.to(device) for t in (query, past_k, new_k, past_v, new_v, mask, weight,
                                   torch.ones(rows), residual)]
    state = (torch.zeros(kv_heads, dtype=torch.int32, device=device),
             torch.zeros(SLOTS * STRIDE, dtype=torch.int32, device=device))
    positions = torch.tensor([30], device=device) if store else None
    return made, state, positions, want


@pytest.mark.parametrize("store", [False, True])
def test_attention_o_words_rows_are_exact(store):
    """o's rows as words after an attention that is exactly one slot's integer values:
    o equals the float64 product plus the residual, as the I2F form's does, the words
    made fp32 after the spin or before it, both launches (the store form also writes the
    new rows), the join's counts left at zero."""
    device = triton_device()
    from targets.aoti.kernels.attention_o_triton import launch_decode_attention_o
    for words in (1, 2, 0):  # made fp32 after the spin, before it, I2F
        made, (counts, flags), positions, want = _one_slot_layer(device, 70, store)
        query, past_k, new_k, past_v, new_v, mask, weight, scale, residual = made
        got = launch_decode_attention_o(query, past_k, new_k, past_v, new_v, mask, 0.25,
                                        True, counts, weight, scale, residual, flags, 0, 1,
                                        positions, words=words)
        assert torch.equal(got.double().reshape(-1).cpu(), want), (store, words)
        assert not counts.any()
        if store:
            assert torch.equal(past_k[:, :, 30].cpu(), new_k[:, :, 0].cpu())


def test_attention_o_words_are_the_reference_at_fp16():
    """fp16, every slot open, int8 o rows with their scales: reference.decode_attention_o."""
    device = triton_device()
    from targets.aoti.kernels.attention_o_slots import SLOTS, STRIDE
    from targets.aoti.kernels.attention_o_triton import launch_decode_attention_o
    generator = torch.Generator().manual_seed(5)
    heads, kv_heads, slots, dim, rows = 8, 2, 64, 16, 33

    def randn(*shape):
        return torch.randn(*shape, generator=generator).half()
    attention = (randn(1, heads, 1, dim), randn(1, kv_heads, slots, dim),
                 randn(1, kv_heads, 1, dim), randn(1, kv_heads, slots, dim),
                 randn(1, kv_heads, 1, dim), torch.zeros(1, 1, 1, slots + 1).half())
    weight = torch.randint(-128, 128, (rows, heads * dim), generator=generator,
                           dtype=torch.int8)
    scale = (torch.rand(rows, generator=generator) * 0.01 + 0.001).half()
    residual = randn(1, 1, rows)
    counts = torch.zeros(kv_heads, dtype=torch.int32)
    flags = torch.zeros(SLOTS * STRIDE, dtype=torch.int32)
    want = reference.decode_attention_o(*attention, dim ** -0.5, True, counts, weight,
                                        scale, residual, flags, 0, 1)
    on = [t.to(device) for t in (*attention, counts, weight, scale, residual, flags)]
    for words in (1, 2):
        got = launch_decode_attention_o(*on[:6], dim ** -0.5, True, *on[6:], 0, 1,
                                        words=words)
        error = (got.float().cpu() - want.float()).abs().max().item()
        assert error <= 2e-3 * max(1.0, want.float().abs().max().item()), (words, error)
