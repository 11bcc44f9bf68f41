"""Weight rows of each width the decode kernels read, for tests that run one kernel over
each and check it against reference.* (which takes every width as (weight,
weight_scale)): float rows in the activations' dtype, int8 rows with a scale a row, int4
rows (int4_rows.py's packed bytes and their groups' (scale, offset) pairs)."""

from __future__ import annotations

import torch

from targets.aoti.kernels import int4_rows

WIDTHS = ("float", "int8", "int4")


def rows_of(weight: torch.Tensor, width: str, dtype: torch.dtype, device, group: int = 128
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, weight_scale) of float rows [N, K] at ``width`` on ``device``: int8 rows
    scaled to their largest magnitude (127), int4 rows in groups of ``group``."""
    if width == "float":
        return weight.to(device, dtype), None
    if width == "int8":
        top = weight.float().abs().amax(1, keepdim=True)
        q = (weight.float() / top * 127).round().to(torch.int8)
        return q.to(device), (top.reshape(-1) / 127).to(device, dtype)
    if width == "int4":
        packed, scales = int4_rows.pack(weight.to(dtype), group)
        return packed.to(device), scales.to(device)
    raise ValueError(f"width {width!r}: one of {WIDTHS}")
