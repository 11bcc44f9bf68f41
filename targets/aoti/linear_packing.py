"""float32 linears of a frozen CPU build stay on ATen's GEMM (MKL), as eager runs them.

Freezing lets Inductor repack constant weights for faster kernels. For float32 linears its
JIT mode packs them for MKL's GEMM; an AOTInductor library cannot hold MKL's packed
weights (their layout depends on their address), so in AOT mode Inductor packs them for
oneDNN's linear instead, and that ran BERT-base and ConvNeXt-T slower than leaving the
linear an ATen ``addmm`` on the frozen weight (MKL's sgemm, as eager; bench/RESULTS.md).
Convolutions keep their oneDNN packing, and low-precision or quantized linears keep
theirs: only the float32 check of Inductor's linear-packing patterns says "not packable".
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Iterator

import torch

log = logging.getLogger(__name__)

CHECK_NAME = "_is_packable_linear"  # Inductor's extra check on its linear-packing patterns


@contextlib.contextmanager
def float32_linears_unpacked() -> Iterator[int]:
    """While open, Inductor's freezing leaves float32 linears unpacked where MKL serves
    them (x86 builds of torch); yields how many patterns it changed (0: nothing to do)."""
    if not torch._C.has_mkl or torch.ops.mkldnn._is_mkldnn_acl_supported():
        yield 0  # no MKL, or Arm's ACL: oneDNN is the float32 GEMM there
        return
    try:
        from torch._inductor.fx_passes import freezing_patterns
        freezing_patterns.lazy_init()  # registers the patterns once, as freezing would
        entries = [entry for patterns in freezing_patterns.pass_patterns
                   for found in patterns.patterns.values() for entry in found
                   if getattr(entry.extra_check, "__name__", "") == CHECK_NAME]
    except (ImportError, AttributeError) as exc:  # another torch's layout: leave it be
        log.debug("Inductor's linear packing not found (%s); float32 linears packed", exc)
        yield 0
        return
    originals = [entry.extra_check for entry in entries]
    for entry, original in zip(entries, originals):
        checked = functools.partial(_packable_unless_float32, original)
        checked.__name__ = CHECK_NAME  # type: ignore[attr-defined]
        entry.extra_check = checked
    try:
        yield len(entries)
    finally:
        for entry, original in zip(entries, originals):
            entry.extra_check = original


def _packable_unless_float32(original, match) -> bool:
    node = match.output_node()
    weight = node.args[2 if node.target is torch.ops.aten.addmm.default else 1]
    value = getattr(weight, "meta", {}).get("val")
    reduced = torch.backends.mkldnn.matmul.fp32_precision in ("bf16", "tf32")
    if value is not None and value.dtype == torch.float32 and not reduced:
        return False
    return original(match)
