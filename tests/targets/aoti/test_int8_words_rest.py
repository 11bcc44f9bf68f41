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
