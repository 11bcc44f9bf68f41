"""The decode passes over int4 rows (``--quantize int4-weight``, kernels/int4_rows.py) with
``Generation.int4_fused``: the greedy token taken in the head's kernel
(passes/decode_argmax.py) and each attention joined with o (passes/attention_o.py), the
store and advancing forms too, where the target asks; without it an int4 step keeps
torch's argmax and the two launches, as before. The step computes what it did. On the
CPU, through the ops' reference kernels (the kernels: test_head_argmax_int4.py,
test_decode_attention_o_int4.py)."""

from __future__ import annotations

import functools

import pytest
import torch

from targets.aoti.kernels import int4_rows
from targets.aoti.passes.decode_kernels import DecodeAttentionAsKernel, RowLinearsAsKernels
from tests.targets.aoti.test_decode_kernels import _calls, _captured, _randomised

pytest.importorskip("transformers")

LAYERS = 2
OP = "edge_exporter.{}.default".format


@functools.cache  # the passes build new programs: one capture serves every test
def _int4_step(dtype=torch.float32, store_rows=False):
    """A tiny llama's greedy step, quantized to int4 rows before the decode passes (as
    the cuda target runs them), its attention placed."""
    from passes.quantize.quantize_weight_only import QuantizeWeightOnly
    program, past = _captured("llama", 1, dtype, next_token=True)
    quantize = QuantizeWeightOnly("int4-weight", "weight-only", "cuda",
                                  swap_linear=int4_rows.swap, layout=int4_rows.LAYOUT)
    quantized = quantize(program).program
    return DecodeAttentionAsKernel(store_rows=store_rows)(quantized).program, past


def _run(program, past, ids=None, positions=None):
    ids = torch.tensor([[7]]) if ids is None else ids
    positions = torch.tensor([9]) if positions is None else positions
    with torch.no_grad():
        return program.module()(ids, positions, *_randomised(past).values())


def _assert_same(got, want, tolerance):
    assert list(got) == list(want)
    for name in want:
        torch.testing.assert_close(got[name].float(), want[name].float(), rtol=tolerance,
                                   atol=tolerance)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-4), (torch.float16, 2e-2)])
def test_int4_heads_and_o_join_where_asked(dtype, tolerance):
    """With ``int4``: one row_gemv_argmax over the head's int4 rows (no torch argmax),
    every layer's attention and o one decode_attention_o over o's int4 rows and their
    pairs; the outputs are the step's without, its token its logits' argmax."""
    step, past = _int4_step(dtype)
    plain = RowLinearsAsKernels(attention_o=True)(step)
    result = RowLinearsAsKernels(attention_o=True, int4=True)(step)
    assert plain.info["argmax_in_head"] == 0 and plain.info["attention_o"] == 0
    assert result.info["argmax_in_head"] == 1 and result.info["attention_o"] == LAYERS
    assert result.info["int4_linears"] == plain.info["int4_linears"] == 4 * LAYERS + 1
    calls = _calls(result.program)
    assert calls[OP("row_gemv_argmax")] == 1 and not calls["aten.argmax.default"]
    assert calls[OP("decode_attention_o")] == LAYERS and not calls[OP("decode_attention")]
    stored = {n.name: n.meta["val"] for n in result.program.graph.nodes
              if n.op == "placeholder"}
    joined = [n for n in result.program.graph.nodes if str(n.target) == OP("decode_attention_o")]
    head = next(n for n in result.program.graph.nodes if str(n.target) == OP("row_gemv_argmax"))
    for weight, scales in [(n.args[9], n.args[10]) for n in joined] + [(head.args[1],
                                                                        head.args[6])]:
        assert stored[weight.name].dtype == torch.uint8 and stored[scales.name].dim() == 3
    got, want = _run(result.program, past), _run(plain.program, past)
    _assert_same(got, want, tolerance)
    assert int(got["next_token"]) == int(got["logits"][0, -1].argmax())


def test_without_the_switch_an_int4_step_keeps_its_launches():
    """The current behaviour: the head stays row_gemv + torch's argmax, attention and o
    two launches, whatever the other flags ask."""
    step, _ = _int4_step(store_rows=True)
    result = RowLinearsAsKernels(attention_o=True, advance_inputs=True)(step)
    assert result.info["argmax_in_head"] == 0 and result.info["attention_o"] == 0
    assert result.info["inputs_advanced"] == 0
    calls = _calls(result.program)
    assert calls["aten.argmax.default"] == 1 and calls[OP("decode_attention_store")] == LAYERS


def test_the_store_and_advancing_forms_over_int4_rows():
    """With the cuda target's other flags (store_rows, advance_inputs): each layer one
    decode_attention_o_store, the head row_gemv_argmax_advance; the outputs the plain
    step's, each past buffer the step's rows at their slot, the caller's ids and
    position holding the token and position + 1."""
    step, past = _int4_step(store_rows=True)
    plain, _ = _int4_step()
    want = _run(RowLinearsAsKernels()(plain).program, past)
    result = RowLinearsAsKernels(attention_o=True, advance_inputs=True, int4=True)(step)
    assert result.info["attention_o"] == LAYERS and result.info["inputs_advanced"] == 1
    calls = _calls(result.program)
    assert calls[OP("decode_attention_o_store")] == LAYERS
    assert not calls[OP("decode_attention_store")] and not calls["aten.argmax.default"]
    cache = _randomised(past)
    buffers = {k: v.clone() for k, v in cache.items()}
    ids, positions = torch.tensor([[7]]), torch.tensor([9])
    with torch.no_grad():
        got = result.program.module()(ids, positions, *buffers.values())
    _assert_same(got, want, 1e-4)
    for name, buffer in buffers.items():
        expected = cache[name].clone()
        expected[:, :, 9 % buffer.shape[2]] = got[name][:, :, 0]
        assert torch.equal(buffer, expected), name
    assert ids.tolist() == [[int(got["next_token"])]] and positions.tolist() == [10]


def test_the_cuda_target_fuses_at_int4_and_the_pass_takes_it_from_the_facet(monkeypatch,
                                                                             tmp_path):
    """``Generation.int4_fused``: off in the facet's default, on for cuda (timed on a
    whole int4 build); the decode pass takes it from the facet."""
    import dataclasses

    from targets.aoti.cuda import CudaTarget
    from targets.aoti.kernels import ops
    from targets.base import LowerOptions
    from targets.facets.generation import Generation
    assert Generation().int4_fused is False and CudaTarget.generation.int4_fused is True
    if not ops.TRITON:
        pytest.skip("the cuda target places its decode kernels only with Triton installed")
    target = CudaTarget()

    def asked():
        return [p.int4 for p in target.default_passes(LowerOptions(tmp_path))
                if p.name == "row_linears_as_kernels"]
    assert asked() == [True]
    monkeypatch.setattr(CudaTarget, "generation",
                        dataclasses.replace(CudaTarget.generation, int4_fused=False))
    assert asked() == [False]
