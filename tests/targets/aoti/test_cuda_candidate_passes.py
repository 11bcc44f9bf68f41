"""The cuda target's GEMM rewrites after session 60: a linear's unaligned input width
padded with zeros (still a candidate, targets/aoti/cuda.py CANDIDATE_PASSES), and a
linear + tanh GELU as one GEMM with cuBLASLt's GELU epilogue (default since session 61).
Checked against eager on the CPU, marked cuda with the rest of the target's own tests."""

from __future__ import annotations

import copy

import pytest
import torch

from targets.aoti.cuda import CANDIDATE_PASSES
from targets.aoti.passes.aligned_linears import (
    LinearInputsAlignedByPadding,
    LinearsAlignedByPadding,
)
from targets.aoti.passes.gelu_epilogues import TanhGeluAsGemmEpilogue

pytestmark = pytest.mark.cuda


class _TokenMlp(torch.nn.Module):
    """MLP-Mixer's token MLP: linears over a transposed input of 196 tokens; an aligned
    channel linear, which must stay."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(196, 24)
        self.fc2 = torch.nn.Linear(24, 196)
        self.channels = torch.nn.Linear(16, 16, bias=False)

    def forward(self, x):
        y = self.fc2(torch.nn.functional.gelu(self.fc1(x.transpose(1, 2))))
        return self.channels(x + y.transpose(1, 2))


class _TiedOddWidth(torch.nn.Module):
    """A head tied to an embedding of odd width: its lookups must stay that wide."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(37, 13)
        self.head = torch.nn.Linear(13, 37, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.embed(ids))


def _ops(program) -> list[str]:
    return [str(n.target) for n in program.graph.nodes if n.op == "call_function"]


def _shapes(program) -> list[tuple]:
    return sorted(tuple(t.shape) for t in program.state_dict.values())


def test_candidates_are_named_for_the_gap_bench_and_off_by_default(tmp_path):
    from targets import get_target
    from targets.base import LowerOptions
    assert "linear_inputs_aligned_by_padding" in CANDIDATE_PASSES
    defaults = {p.name for p in get_target("cuda").default_passes(LowerOptions(tmp_path))}
    assert not defaults & set(CANDIDATE_PASSES)


def test_unaligned_input_width_is_padded_with_zeros_and_values_stay_eager():
    torch.manual_seed(0)
    model, x = _TokenMlp().eval().half(), torch.randn(2, 196, 16, dtype=torch.half)
    program = torch.export.export(model, (x,))
    plain = LinearsAlignedByPadding()(program)
    # the default pass pads fc2's 196 outputs to 200; fc1 keeps its 196 inputs
    assert {(24, 196), (200, 24)} <= set(_shapes(plain.program))
    result = LinearInputsAlignedByPadding()(plain.program)
    assert result.modified and result.info["linears_padded"] == 1
    shapes = _shapes(result.program)  # 196 fp16 inputs -> 200: 16-byte rows
    assert (24, 200) in shapes and (24, 196) not in shapes and (16, 16) in shapes
    assert "aten.pad.default" in _ops(result.program)
    fresh = torch.randn(2, 196, 16, dtype=torch.half)
    with torch.no_grad():  # eager in float32 on the same half-precision weights
        want = copy.deepcopy(model).float()(fresh.float())
    torch.testing.assert_close(result.program.module()(fresh).float(), want, atol=5e-3,
                               rtol=5e-3)


def test_both_widths_padded_in_one_linear_and_a_tied_embedding_keeps_its_width():
    torch.manual_seed(0)
    odd = torch.nn.Linear(13, 37).eval()  # float32: 4-element steps, 13 -> 16 and 37 -> 40
    result = LinearInputsAlignedByPadding()(torch.export.export(odd, (torch.randn(3, 13),)))
    assert _shapes(result.program) == [(40,), (40, 16)]
    fresh = torch.randn(3, 13)
    got = result.program.module()(fresh)
    assert got.shape == (3, 37)
    torch.testing.assert_close(got, odd(fresh))

    tied, ids = _TiedOddWidth().eval(), torch.tensor([[0, 36, 5]])
    result = LinearInputsAlignedByPadding()(torch.export.export(tied, (ids,)))
    assert _shapes(result.program) == [(40, 13)]  # rows padded, one copy, 13 wide
    torch.testing.assert_close(result.program.module()(ids), tied(ids))


class _LinearGelu(torch.nn.Module):
    def __init__(self, approximate: str, leak: bool = False) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 40)
        self.approximate, self.leak = approximate, leak

    def forward(self, x):
        h = self.fc(x)
        y = torch.nn.functional.gelu(h, approximate=self.approximate)
        return (y, h) if self.leak else y

    def reference(self, x, approximate: str):
        return torch.nn.functional.gelu(self.fc(x), approximate=approximate)


def _gpt2_mlp():
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
    config = GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=64, bos_token_id=0,
                        eos_token_id=0)
    assert config.activation_function == "gelu_new"  # written out: tanh, pow, muls
    mlp = GPT2MLP(64, config).eval()
    mlp.reference = lambda x, approximate: mlp.c_proj(
        torch.nn.functional.gelu(mlp.c_fc(x), approximate=approximate))
    return mlp


# What ``_addmm_activation(use_gelu=True)`` computes where it runs: ATen's CUDA kernels the
# tanh GELU (cuBLASLt's epilogue, or the GEMM then gelu_(tanh)), its CPU kernel the exact one
_DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no GPU here"))]
_EPILOGUE_GELU = {"cpu": "none", "cuda": "tanh"}


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("make", [lambda: _LinearGelu("tanh"), _gpt2_mlp],
                         ids=["gelu_tanh", "gpt2_written_out"])
def test_tanh_gelu_after_a_linear_becomes_one_gemm_with_its_operands(make, device):
    torch.manual_seed(0)
    model, x = make().to(device), torch.randn(2, 5, 16, device=device)
    result = TanhGeluAsGemmEpilogue()(torch.export.export(model, (x,)))
    assert result.modified and result.info["gelu_epilogues"] == 1
    ops = _ops(result.program)
    assert "aten._addmm_activation.default" in ops
    assert not {"aten.gelu.default", "aten.tanh.default"} & set(ops)
    fresh = torch.randn(2, 5, 16, device=device)
    with torch.no_grad():
        torch.testing.assert_close(model(fresh), model.reference(fresh, "tanh"))
        torch.testing.assert_close(result.program.module()(fresh),
                                   model.reference(fresh, _EPILOGUE_GELU[device]))


@pytest.mark.parametrize("model", [_LinearGelu("none"), _LinearGelu("tanh", leak=True)],
                         ids=["exact_gelu", "gemm_read_elsewhere"])
def test_exact_gelu_and_a_gemm_read_elsewhere_stay(model):
    result = TanhGeluAsGemmEpilogue()(torch.export.export(model, (torch.randn(3, 16),)))
    assert not result.modified
