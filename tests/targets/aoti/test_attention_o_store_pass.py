"""passes/attention_o.py with the store form: where the attention pass chose an attention
that stores the step's new K/V rows (``store_rows``) and the target asks for the join
with o (``attention_o``), each layer becomes one ``decode_attention_o_store``: the step
computes what it did, each past buffer holds exactly the step's rows at their slot, and
the partition still names those outputs stored. On the CPU, through the ops' reference
kernels."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.passes.attention_store import stored_outputs
from targets.aoti.passes.decode_kernels import DecodeAttentionAsKernel, RowLinearsAsKernels
from tests.targets.aoti.test_decode_kernels import _calls, _captured, _randomised

pytest.importorskip("transformers")

JOINED_STORE = "edge_exporter.decode_attention_o_store.default"
OTHERS = ("edge_exporter.decode_attention_o.default",
          "edge_exporter.decode_attention_store.default",
          "edge_exporter.decode_attention.default")
LAYERS = 2


def _quantized(program, int8: bool):
    if not int8:
        return program
    pytest.importorskip("torchao")
    from passes.quantize.quantize_weight_only import QuantizeWeightOnly
    return QuantizeWeightOnly("int8-weight", "weight-only", "cuda")(program).program


@pytest.mark.parametrize("family,dtype,int8,position,tolerance", [
    ("llama", torch.float32, False, 9, 1e-4),
    ("llama", torch.float16, False, 9, 2e-2),
    ("qwen2", torch.float32, True, 9, 1e-4),  # int8 rows with their scales
    ("mistral", torch.float32, False, 20, 1e-4),  # a ring of its window, wrapped round
])
def test_each_layer_joins_o_and_stores_its_rows(family, dtype, int8, position, tolerance):
    """Every layer's attention (the store form) and o are one op given the step's
    positions and the shared counts; no other attention is left; the outputs are the
    plain step's (neither joined nor stored), each past buffer is the cache as the
    runtime's write would leave it, and the stored outputs are the k_i/v_i."""
    program, past = _captured(family, 1, dtype)
    program = _quantized(program, int8)  # before the decode passes, as the target runs it
    plain = RowLinearsAsKernels()(DecodeAttentionAsKernel()(program).program).program
    stored = DecodeAttentionAsKernel(store_rows=True)(program).program
    result = RowLinearsAsKernels(attention_o=True)(stored)
    assert result.info["attention_o"] == LAYERS
    calls = _calls(result.program)
    assert calls[JOINED_STORE] == LAYERS and not any(calls[name] for name in OTHERS)
    joined = [n for n in result.program.graph.nodes if str(n.target) == JOINED_STORE]
    assert len({n.args[15] for n in joined}) == 1 and joined[0].args[15].op == "placeholder"
    assert len({n.args[8] for n in joined}) == 1  # the join's counts, one buffer for all
    assert all((n.args[10] is not None) == int8 for n in joined)  # int8 rows' scales
    assert stored_outputs(result.program) == tuple(range(1, 1 + 2 * LAYERS))

    cache = _randomised(past)
    ids, positions = torch.tensor([[7]]), torch.tensor([position])
    with torch.no_grad():
        want = plain.module()(ids, positions, *(v.clone() for v in cache.values()))
        buffers = {k: v.clone() for k, v in cache.items()}
        got = result.program.module()(ids, positions, *buffers.values())
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=tolerance, atol=tolerance)
    for name, buffer in buffers.items():  # past "k_0": exactly the step's output "k_0"
        expected = cache[name].clone()
        expected[:, :, position % buffer.shape[2]] = got[name][:, :, 0]
        assert torch.equal(buffer, expected), name


def test_with_store_rows_alone_the_attention_stores_in_its_own_launch():
    """Without the join the store form stays as the attention pass placed it."""
    program, _ = _captured("llama", 1)
    result = RowLinearsAsKernels()(DecodeAttentionAsKernel(store_rows=True)(program).program)
    calls = _calls(result.program)
    assert calls["edge_exporter.decode_attention_store.default"] == LAYERS
    assert not calls[JOINED_STORE] and "attention_o" not in result.info
    assert stored_outputs(result.program) == tuple(range(1, 1 + 2 * LAYERS))
