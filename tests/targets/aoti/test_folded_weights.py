"""A frozen AOTInductor library's int8 weights: Inductor's constant folding (what freezing
runs) folds an int8 weight's dequantize into a float constant except at bfloat16, and the
build says so (targets/aoti/folded_weights.py)."""

from __future__ import annotations

import pytest
import torch
from torch._inductor.constant_folding import constant_fold
from torch.fx.experimental.proxy_tensor import make_fx

from targets.aoti.folded_weights import folded_int8_note, int8_dequantizes_folded


def _traced(dtype: torch.dtype) -> torch.fx.GraphModule:
    """The graph as freezing sees it: after Inductor's decompositions (a widening is
    ``prims.convert_element_type`` there)."""
    from torch._inductor.decomposition import select_decomp_table
    return make_fx(_Int8Linear(dtype), decomposition_table=select_decomp_table())(
        torch.randn(2, 64, dtype=dtype))


class _Int8Linear(torch.nn.Module):
    """torchao's weight-only int8 linear as it decomposes: the weight widened, a GEMM, the
    per-row scales."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("weight", torch.randint(-127, 128, (32, 64), dtype=torch.int8))
        self.register_buffer("scales", torch.rand(32, dtype=dtype))

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight.to(x.dtype)) * self.scales


@pytest.mark.parametrize("dtype, stored_float", [(torch.float32, True), (torch.float16, True),
                                                 (torch.bfloat16, False)])
def test_the_folded_dequantizes_are_the_ones_inductor_stores_as_float(dtype, stored_float):
    module = _traced(dtype)
    with int8_dequantizes_folded() as folded:
        constant_fold(module)
    stored = [getattr(module, n.target) for n in module.graph.nodes if n.op == "get_attr"]
    floats = [t for t in stored if t.is_floating_point() and t.numel() == 32 * 64]
    assert bool(floats) == stored_float  # what the library would hold
    assert bool(folded) == stored_float
    assert bool(folded_int8_note(folded)) == stored_float


def test_nothing_is_recorded_outside_the_context():
    module = _traced(torch.float32)
    with int8_dequantizes_folded() as folded:
        pass
    constant_fold(module)
    assert folded == [] and folded_int8_note(folded) == []


class _Int8Table(torch.nn.Module):
    """torchao's int8 embedding as it decomposes: the whole table dequantized, then the
    lookup."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randint(-127, 128, (50, 16), dtype=torch.int8))
        self.register_buffer("scales", torch.rand(50, 1))

    def forward(self, ids):
        return torch.nn.functional.embedding(ids, self.table.to(torch.float32) * self.scales)


def test_int8_tables_stay_int8_and_the_lookups_still_match():
    """Kept from folding, the table's dequantize is fused into the gather (no cost at run
    time): the constants stay int8, nothing is recorded, the values are the same."""
    from torch._inductor.decomposition import select_decomp_table
    ids = torch.tensor([[3, 7, 49]])
    table = _Int8Table()
    module = make_fx(table, decomposition_table=select_decomp_table())(ids)
    with int8_dequantizes_folded() as folded:
        constant_fold(module)
    stored = [getattr(module, n.target) for n in module.graph.nodes if n.op == "get_attr"]
    assert folded == [] and not [t for t in stored if t.is_floating_point() and t.numel() == 800]
    assert torch.equal(module(ids), table(ids))
