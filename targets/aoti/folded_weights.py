"""Which int8 weights a frozen AOTInductor library stores as float.

A plain build freezes: Inductor folds whatever reads only constants into new constants.
Its weight-only int8 GEMM takes bfloat16 activations only, so it keeps an int8 weight's
dequantize out of folding there alone (torch/_inductor/constant_folding.py,
``is_woq_int8_pattern``); at float32 or float16 the dequantize is folded and the library
stores the float weight: no smaller than an unquantized build. Kept int8 instead, the
dequantize runs on every call (many times the float library's time on the CPU), so the
build keeps the fold and says so. Embedding tables are the exception: kept int8, their
dequantize is fused into the gather at no cost.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def int8_dequantizes_folded() -> Iterator[list[str]]:
    """While open, int8 embedding tables are kept from folding, and the list holds the
    names of the nodes widening an int8 tensor to a float dtype that Inductor's constant
    folding computed as constants: weights the library stores as float."""
    from torch._inductor.constant_folding import ConstantFolder
    folded: list[str] = []
    replace, impure = ConstantFolder.add_node_replacement, ConstantFolder.is_impure

    def recorded(self, node: torch.fx.Node, tensor: torch.Tensor) -> None:
        if _widens_int8(node):
            folded.append(node.name)
        replace(self, node, tensor)

    def table_kept(self, node: torch.fx.Node) -> bool:
        return impure(self, node) or (_widens_int8(node) and _feeds_only_lookups(node))

    ConstantFolder.add_node_replacement = recorded
    ConstantFolder.is_impure = table_kept
    try:
        yield folded
    finally:
        ConstantFolder.add_node_replacement, ConstantFolder.is_impure = replace, impure


# ops that only check their input (torch.export's dtype asserts): not a use of its values
_CHECKS = (torch.ops.aten._assert_tensor_metadata.default,)


def _feeds_only_lookups(node: torch.fx.Node, depth: int = 8) -> bool:
    """Whether every use of ``node`` (through the dequantize's elementwise ops) is the
    table of an embedding lookup: Inductor fuses the dequantize into the gather, so an
    int8 table kept from folding costs nothing at run time and stays int8 (torchao
    dequantizes a whole table before the lookup)."""
    if depth == 0 or not node.users:
        return False
    for user in node.users:
        if (user.target is torch.ops.aten.embedding.default and user.args[0] is node
                or user.target in _CHECKS):
            continue
        if user.op != "call_function" or not _feeds_only_lookups(user, depth - 1):
            return False
    return True


def folded_int8_note(folded: list[str]) -> list[str]:
    if not folded:
        return []
    return [f"{len(folded)} int8 weight(s) are stored as float in this partition's library: "
            "AOTInductor's freezing folds their dequantize (its weight-only int8 GEMM "
            "takes bfloat16 only), so the library is no smaller than an unquantized one; "
            "--target onnx keeps them int8"]


def _widens_int8(node: torch.fx.Node) -> bool:
    source = node.args[0] if node.args else None
    return (node.target is torch.ops.prims.convert_element_type.default
            and isinstance(source, torch.fx.Node)
            and getattr(source.meta.get("val"), "dtype", None) == torch.int8
            and len(node.args) > 1 and isinstance(node.args[1], torch.dtype)
            and node.args[1].is_floating_point)
