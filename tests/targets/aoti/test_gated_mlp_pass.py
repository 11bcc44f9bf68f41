"""passes/gated_mlp.py: the decode pass joins each gated product with down's product
after it (one ``gated_mlp``, down's weight stored transposed) only where the target asks
(``mlp_fused``), and a prompt program reads those down weights transposed too, so a
generating artifact stores each once; the steps compute what they did. On the CPU,
through the ops' reference kernels."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.passes.decode_kernels import DecodeAttentionAsKernel, RowLinearsAsKernels
from targets.aoti.passes.gated_mlp import PromptDownsTransposed, join_gate_up_with_down
from tests.targets.aoti.test_decode_kernels import _calls, _captured, _randomised

pytest.importorskip("transformers")

JOINED = "edge_exporter.gated_mlp.default"
ROW = "edge_exporter.row_gemv.default"
LAYERS = 2


def _step(program, past, position=9, tokens=1, captured=False):
    """The step's outputs; ``captured``: a program as captured (its cache one dict),
    not as a pass recaptured it (flat inputs)."""
    cache = _randomised(past)
    ids = torch.arange(7, 7 + tokens).reshape(1, tokens)
    with torch.no_grad():
        if captured:
            return program.module()(ids, torch.arange(position, position + tokens), cache)
        return program.module()(ids, torch.arange(position, position + tokens),
                                *cache.values())


def _assert_same(got, want, tolerance):
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=tolerance, atol=tolerance)


def _weights(program) -> dict:
    return {**dict(program.named_parameters()), **dict(program.named_buffers()),
            **program.constants}


@pytest.mark.parametrize("exact,acc_dtype", [(False, torch.float32), (True, torch.int64)])
@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-4), (torch.float16, 2e-2)])
def test_each_gated_product_and_down_become_one_op_computing_what_they_did(
        dtype, tolerance, exact, acc_dtype):
    """Every layer's gate/up and down (+ residual) are one op over down's rows
    transposed (its original rows gone from the program), the ops share one buffer of
    sums (float32, or int64 where the sums must be exact) and one counter, and the step's
    outputs are the step's without the join."""
    program, past = _captured("llama", 1, dtype)
    attention = DecodeAttentionAsKernel()(program).program
    plain = RowLinearsAsKernels()(attention)
    result = RowLinearsAsKernels(mlp_fused=True, exact=exact)(attention)
    assert result.info["mlp_fused"] == LAYERS
    assert {k: v for k, v in result.info.items() if k != "mlp_fused"} == plain.info
    calls = _calls(result.program)
    assert calls[JOINED] == LAYERS
    assert calls[ROW] == _calls(plain.program)[ROW] - 2 * LAYERS
    joined = [n for n in result.program.graph.nodes if str(n.target) == JOINED]
    assert len({n.args[8] for n in joined}) == 1 and len({n.args[9] for n in joined}) == 1
    assert joined[0].args[8].meta["val"].dtype == acc_dtype
    before, after = _weights(plain.program), _weights(result.program)
    downs = [t for name, t in before.items() if "down" in name]
    assert len(downs) == LAYERS
    transposed = [t for name, t in after.items() if "down" in name]
    assert len(transposed) == LAYERS and not [t for name, t in after.items()
                                              if "down" in name and not name.endswith("_t")]
    for original in downs:  # the same bytes, transposed: nothing else added
        assert any(t.shape == original.t().shape and torch.equal(t, original.t())
                   for t in transposed)
    assert sum(t.numel() for t in after.values()) == sum(t.numel() for t in before.values())
    _assert_same(_step(result.program, past), _step(plain.program, past), tolerance)


def test_without_the_flag_nothing_is_joined():
    program, _ = _captured("llama", 1)
    result = RowLinearsAsKernels()(DecodeAttentionAsKernel()(program).program)
    assert "mlp_fused" not in result.info and not _calls(result.program)[JOINED]


def test_a_gated_product_read_by_more_than_down_is_not_joined():
    """The op returns down's output only: a gated product something else reads too
    keeps its launch; the other layer is joined."""
    program, _ = _captured("llama", 1)
    linears = RowLinearsAsKernels()(DecodeAttentionAsKernel()(program).program).program
    module = linears.module()
    gated = [n for n in module.graph.nodes if str(n.target) == ROW and n.args[7]]
    with module.graph.inserting_after(gated[0]):
        module.graph.call_function(torch.ops.aten.sum.default, (gated[0],))
    assert join_gate_up_with_down(module) == 1
    assert _calls(module)[JOINED] == 1 and gated[0] in set(module.graph.nodes)


def test_int8_rows_are_not_joined():
    """The fused kernel reads float rows: after --quantize int8-weight nothing joins."""
    pytest.importorskip("torchao")
    from passes.quantize.quantize_weight_only import QuantizeWeightOnly
    program, _ = _captured("qwen2", 1)
    attention = DecodeAttentionAsKernel()(program).program
    quantized = QuantizeWeightOnly("int8-weight", "weight-only", "cuda")(attention).program
    result = RowLinearsAsKernels(mlp_fused=True)(quantized)
    assert result.info["mlp_fused"] == 0 and not _calls(result.program)[JOINED]


def test_a_prompt_program_reads_the_same_transposed_downs():
    """A prompt chunk's down linears become matmuls over the weights stored transposed,
    the very tensors the decode step's ops read (one copy by content), and the chunk
    computes what it did; the one-row decode step is left to the decode pass."""
    prompt, past = _captured("llama", 4)
    result = PromptDownsTransposed()(prompt)
    assert result.info == {"downs_transposed": LAYERS}
    decode, _ = _captured("llama", 1)
    assert PromptDownsTransposed()(decode).info == {"downs_transposed": 0}
    joined = RowLinearsAsKernels(mlp_fused=True)(DecodeAttentionAsKernel()(decode).program)
    mine = [t for name, t in _weights(result.program).items() if "down" in name]
    theirs = [t for name, t in _weights(joined.program).items() if "down" in name]
    assert len(mine) == LAYERS and all(any(torch.equal(a, b) for b in theirs) for a in mine)
    _assert_same(_step(result.program, past, tokens=4), _step(prompt, past, tokens=4, captured=True), 1e-4)
