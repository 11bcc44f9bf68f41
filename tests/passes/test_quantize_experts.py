"""--quantize on a mixture-of-experts' experts (passes/quantize/quantize_experts.py): transformers'
CPU experts op becomes the runtime's int8/int4 grouped matmul over stored quantized
experts. Eager and in-process (one torch.export); a real generating build: test_generation."""

from __future__ import annotations

import pytest
import torch

from passes.quantize.quantize_experts import QuantizeExperts, quantize_int4, quantize_int8
from runtime.generation import experts_op

pytest.importorskip("transformers.integrations.moe")
GROUPED_MM = torch.ops.transformers.grouped_mm_fallback


def _case(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(4, 64, 96, generator=generator)
    rows = torch.randn(10, 64, generator=generator)
    return weight, rows, torch.tensor([3, 3, 7, 10])  # expert 1 gets no rows


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


def test_int8_and_int4_experts_compute_the_float_grouped_matmul():
    weight, rows, offs = _case()
    want = GROUPED_MM(rows, weight, offs)
    q, scale = quantize_int8(weight)
    assert q.dtype == torch.int8 and scale.shape == (4, 1, 96)
    int8 = experts_op.grouped_mm_int8(rows, q, scale, offs)
    packed, scale4 = quantize_int4(weight, 32)
    assert packed.dtype == torch.uint8 and packed.shape == (4, 2, 16, 96)  # two a byte
    int4 = experts_op.grouped_mm_int4(rows, packed, scale4, offs)
    assert _relative(int8, want) < 0.01 and _relative(int4, want) < 0.15


def test_int4_packing_is_exact_on_representable_weights():
    """Weights that are a scale times integers in [-7, 7] come back exactly (each
    nibble in its place: an odd/even swap would not)."""
    values = torch.randint(-7, 8, (2, 64, 8), generator=torch.Generator().manual_seed(1))
    values[:, 0] = 7  # every group's absmax is 7: its scale is exactly the one below
    values[:, 32] = -7
    weight = values.float() * 0.25
    packed, scale = quantize_int4(weight, 32)
    assert torch.equal(experts_op.dequantize_int4(packed, scale, torch.float32), weight)


class _Experts(torch.nn.Module):
    """transformers' call: weights stored [E, out, in], transposed into the op."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(weight.transpose(1, 2).contiguous())

    def forward(self, rows, offs):
        return GROUPED_MM(rows, self.gate_up_proj.transpose(-2, -1), offs=offs)


@pytest.mark.parametrize("recipe,op", [("int8-weight", "grouped_mm_int8"),
                                       ("int4-weight", "grouped_mm_int4"),
                                       ("int8-dynamic", "grouped_mm_int8")])
def test_the_pass_swaps_the_experts_op_and_reports_the_bytes(recipe, op):
    weight, rows, offs = _case(2)
    program = torch.export.export(_Experts(weight).eval(), (rows, offs))
    result = QuantizeExperts(recipe)(program)
    targets = [str(n.target) for n in result.program.graph.nodes if n.op == "call_function"]
    assert result.modified and f"edge_exporter.{op}.default" in targets
    assert not any("grouped_mm_fallback" in t for t in targets)
    info = result.info
    assert len(info["layers_quantized"]) == 1 and info["layers_float"] == []
    assert info["weight_bytes_before"] == weight.numel() * 4
    assert info["weight_bytes_after"] < info["weight_bytes_before"] / (3.5 if "8" in op else 6)
    stored = [t.dtype for t in [*result.program.state_dict.values(),
                                *result.program.constants.values()]]
    assert torch.float32 in stored and (torch.int8 in stored or torch.uint8 in stored)
    assert all(t.dim() != 3 or t.dtype != torch.float32 or 1 in t.shape
               for t in [*result.program.state_dict.values(), *result.program.constants.values()])
    got = result.program.module()(rows, offs)
    assert _relative(got, GROUPED_MM(rows, weight, offs)) < (0.01 if "8" in op else 0.15)


def test_a_program_without_experts_is_left_alone():
    program = torch.export.export(torch.nn.Linear(4, 4).eval(), (torch.randn(2, 4),))
    result = QuantizeExperts("int8-weight")(program)
    assert not result.modified and result.program is program and result.info == {}
