"""gemv_config's rules (kernels/triton_kernels.py) by shape, beyond the row loop's
(test_row_loop.py): which launches take which block, warps and columns ahead."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")


def test_dependent_small_products_of_16_bit_rows_take_four_warps():
    """The ~1.1B's o (2,048 x 2,048) as a dependent launch: two rows, 4 warps, its whole
    rows ahead; its plain launch, int8 rows and gated products keep 8 warps; products
    that are not small keep theirs."""
    from targets.aoti.kernels.triton_kernels import gemv_config
    assert gemv_config(2048, 2048, False, True, 2, 132) == (2, 512, 4, 2048)
    assert gemv_config(896, 896, False, True, 2, 132) == (2, 512, 4, 512)
    assert gemv_config(2048, 2048, False, False, 2, 132) == (2, 512, 8, 0)
    assert gemv_config(2048, 2048, False, True, 1, 132) == (2, 1024, 8, 2048)
    assert gemv_config(2048, 2048, True, True, 2)[2] == 8  # gated, no GPU's count
    assert gemv_config(2560, 2048, False, True, 2, 132) == (4, 512, 4, 2048)  # q/k/v


def test_dependent_launches_of_long_int8_rows_with_counters_split_along_k():
    """The ~1.1B's int8 down (2,048 x 5,632) as a dependent launch given counters: 11
    parts of 512 columns, 8 rows and 4 warps a program, each part's whole width
    ahead; a plain launch, fp16 rows, rows a program holds whole ahead (o's 2,048),
    a product without counters (a norm, a gate) keep the one-block kernel."""
    from targets.aoti.kernels.split_gemv_triton import split_config
    from targets.aoti.kernels.triton_kernels import gemv_config
    assert gemv_config(2048, 5632, False, True, 1, 132, True) == (8, 512, 4, 512, False,
                                                                  0, 11)
    assert split_config(11008) == (8, 512, 4, 512, 22)  # the last part masked
    assert split_config(300) == (8, 512, 4, 512, 1)
    for other in (gemv_config(2048, 5632, False, False, 1, 132, True),
                  gemv_config(2048, 5632, False, True, 2, 132, True),
                  gemv_config(2048, 2048, False, True, 1, 132, True),
                  gemv_config(2048, 5632, False, True, 1, 132)):
        assert len(other) == 4
    assert gemv_config(2048, 5632, False, True, 1, 132) == (4, 1024, 4, 2048)
