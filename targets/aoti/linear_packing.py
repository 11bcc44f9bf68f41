"""float32 linears of a frozen CPU build stay on ATen's GEMM (MKL), as eager runs them.

Freezing lets Inductor repack constant weights for faster kernels. For float32 linears its
JIT mode packs them for MKL's GEMM; an AOTInductor library cannot hold MKL's packed
weights (their layout depends on their address), so in AOT mode Inductor packs them for
oneDNN's linear instead, and that ran BERT-base and ConvNeXt-T slower than leaving the
linear an ATen ``addmm`` on the frozen weight (MKL's sgemm, as eager) on an AVX2 EPYC, and
ViT-B/16 faster on an AVX-512 Xeon (bench/RESULTS.md). So the cpu target compiles both
where the linears are worth it and keeps the faster (choice.py); this module is the MKL
form, and counts the multiply-adds of the linears it leaves unpacked.
Convolutions keep their oneDNN packing, and low-precision or quantized linears keep
theirs: only the float32 check of Inductor's linear-packing patterns says "not packable".
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from typing import Iterator

import torch

log = logging.getLogger(__name__)

CHECK_NAME = "_is_packable_linear"  # Inductor's extra check on its linear-packing patterns


@dataclasses.dataclass
class Unpacked:
    """What one compile left unpacked: Inductor's patterns changed, and the multiply-adds
    a call of the float32 linears kept on ATen's GEMM (their batch at its size hint)."""
    patterns: int = 0
    macs: int = 0
    seen: set = dataclasses.field(default_factory=set, repr=False)

    def add(self, node, rows, inner: int, outer: int) -> None:
        if node.name not in self.seen:  # a node may be checked by several patterns
            self.seen.add(node.name)
            self.macs += _hint(rows) * _hint(inner) * _hint(outer)


@contextlib.contextmanager
def float32_linears_unpacked() -> Iterator[Unpacked]:
    """While open, Inductor's freezing leaves float32 linears unpacked where MKL serves
    them (x86 builds of torch); yields what it left (``patterns`` 0: nothing to do)."""
    unpacked = Unpacked()
    if not torch._C.has_mkl or torch.ops.mkldnn._is_mkldnn_acl_supported():
        yield unpacked  # no MKL, or Arm's ACL: oneDNN is the float32 GEMM there
        return
    try:
        from torch._inductor.fx_passes import freezing_patterns
        freezing_patterns.lazy_init()  # registers the patterns once, as freezing would
        entries = [entry for patterns in freezing_patterns.pass_patterns
                   for found in patterns.patterns.values() for entry in found
                   if getattr(entry.extra_check, "__name__", "") == CHECK_NAME]
    except (ImportError, AttributeError) as exc:  # another torch's layout: leave it be
        log.debug("Inductor's linear packing not found (%s); float32 linears packed", exc)
        yield unpacked
        return
    originals = [entry.extra_check for entry in entries]
    for entry, original in zip(entries, originals):
        checked = functools.partial(_packable_unless_float32, original, unpacked)
        checked.__name__ = CHECK_NAME  # type: ignore[attr-defined]
        entry.extra_check = checked
    unpacked.patterns = len(entries)
    try:
        yield unpacked
    finally:
        for entry, original in zip(entries, originals):
            entry.extra_check = original


def _packable_unless_float32(original, unpacked: Unpacked, match) -> bool:
    if not original(match):
        return False
    node = match.output_node()
    first = 1 if node.target is torch.ops.aten.addmm.default else 0
    rows, weight = node.args[first], node.args[first + 1]
    value = getattr(weight, "meta", {}).get("val")
    reduced = torch.backends.mkldnn.matmul.fp32_precision in ("bf16", "tf32")
    if value is not None and value.dtype == torch.float32 and not reduced:
        shape = getattr(rows, "meta", {}).get("val")
        unpacked.add(node, shape.shape[0] if shape is not None else 1, *value.shape)
        return False
    return True


def _hint(size) -> int:
    """A dim's value, or a dynamic one's size hint (1 where it has none)."""
    if isinstance(size, int):
        return size
    hint = getattr(getattr(size, "node", None), "hint", None)
    return int(hint) if isinstance(hint, int) else 1
