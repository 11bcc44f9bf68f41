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
