"""passes/attention_o.py: the decode pass joins each attention with o's product after it
(one ``decode_attention_o``) only where the target asks (``attention_o``), only for a
joined attention whose output o alone reads (one that stores its rows:
test_attention_o_store_pass.py); the step then computes what it did. On the CPU,
through the ops' reference kernels."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels.attention_o_slots import SLOTS, STRIDE, flag_slots, joins_o
from targets.aoti.passes.decode_kernels import DecodeAttentionAsKernel, RowLinearsAsKernels
from tests.targets.aoti.test_decode_kernels import _calls, _captured, _randomised

pytest.importorskip("transformers")

JOINED = "edge_exporter.decode_attention_o.default"
PLAIN = "edge_exporter.decode_attention.default"
LAYERS = 2


def _step(program, past, position=9):
    cache = _randomised(past)
    with torch.no_grad():
        return program.module()(torch.tensor([[7]]), torch.tensor([position]),
                                *cache.values())


def _assert_same(got, want, tolerance):
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-4), (torch.float16, 2e-2)])
def test_each_attention_and_its_o_become_one_op_computing_what_they_did(dtype, tolerance):
    """Every layer's attention and o (+ residual) are one op, with no attention or o
    product left; the ops share the attentions' counts and one flags buffer of 3 slots,
    take their slots in order (each zeroes the next's), and the step's outputs are the
    step's without the join."""
    program, past = _captured("llama", 1, dtype)
    attention = DecodeAttentionAsKernel()(program).program
    plain = RowLinearsAsKernels()(attention)
    result = RowLinearsAsKernels(attention_o=True)(attention)
    assert result.info["attention_o"] == LAYERS
    assert {k: v for k, v in result.info.items() if k != "attention_o"} == plain.info
    calls = _calls(result.program)
    assert calls[JOINED] == LAYERS and not calls[PLAIN]
    assert calls["edge_exporter.row_gemv.default"] == \
        _calls(plain.program)["edge_exporter.row_gemv.default"] - LAYERS
    joined = [n for n in result.program.graph.nodes if str(n.target) == JOINED]
    assert len({n.args[8] for n in joined}) == 1  # the join's counts, one buffer for all
    flags = {n.args[12] for n in joined}
    assert len(flags) == 1 and flags.pop().meta["val"].shape == (SLOTS * STRIDE,)
    assert [tuple(n.args[13:]) for n in joined] == flag_slots(LAYERS)
    assert all(n.args[10] is None for n in joined)  # float rows: no scales
    _assert_same(_step(result.program, past), _step(plain.program, past), tolerance)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-4), (torch.float16, 2e-2)])
def test_int8_rows_join_with_their_scales(dtype, tolerance):
    """After --quantize int8-weight, o is row_gemv over int8 rows and their scales (and
    may be split along K): the op takes the rows and the scales, the step unchanged."""
    pytest.importorskip("torchao")
    from passes.quantize.quantize_weight_only import QuantizeWeightOnly
    program, past = _captured("qwen2", 1, dtype)
    attention = DecodeAttentionAsKernel()(program).program
    quantized = QuantizeWeightOnly("int8-weight", "weight-only", "cuda")(attention).program
    plain = RowLinearsAsKernels()(quantized)
    result = RowLinearsAsKernels(attention_o=True)(quantized)
    assert result.info["attention_o"] == LAYERS
    joined = [n for n in result.program.graph.nodes if str(n.target) == JOINED]
    assert len(joined) == LAYERS and all(n.args[10] is not None for n in joined)
    _assert_same(_step(result.program, past), _step(plain.program, past), tolerance)


def test_without_the_flag_nothing_is_joined():
    program, _ = _captured("llama", 1)
    result = RowLinearsAsKernels()(DecodeAttentionAsKernel()(program).program)
    assert "attention_o" not in result.info
    assert not _calls(result.program)[JOINED] and _calls(result.program)[PLAIN] == LAYERS


def test_an_attention_read_by_more_than_o_is_not_joined():
    """The op returns o's output only: an attention whose output something else reads
    too keeps its launch; the other layer is joined."""
    from targets.aoti.passes.attention_o import join_attention_with_o
    program, _ = _captured("llama", 1)
    linears = RowLinearsAsKernels()(DecodeAttentionAsKernel()(program).program).program
    module = linears.module()
    first = next(n for n in module.graph.nodes if str(n.target) == PLAIN)
    with module.graph.inserting_after(first):
        module.graph.call_function(torch.ops.aten.sum.default, (first,))
    assert join_attention_with_o(module) == 1
    calls = _calls(module)
    assert calls[JOINED] == 1 and calls[PLAIN] == 1
    assert first in {n for n in module.graph.nodes}


def test_prompt_chunks_join_nothing():
    """A prefill step keeps SDPA: no decode attention, nothing to join."""
    program, _ = _captured("llama", 4)
    result = RowLinearsAsKernels(attention_o=True)(DecodeAttentionAsKernel()(program).program)
    assert not result.info.get("attention_o") and not _calls(result.program)[JOINED]


@pytest.mark.parametrize("layers", [1, 2, 3, 22, 23])
def test_no_two_launches_in_a_row_share_a_flag_slot(layers):
    """Each launch zeroes the next one's slot, the last the next call's first, no launch
    counts on the slot of the launch before it (across calls too), and none zeroes its
    own (one layer, its own next, zeroes a slot no launch uses)."""
    pairs = flag_slots(layers)
    assert len(pairs) == layers and all(0 <= s < SLOTS and 0 <= r < SLOTS for s, r in pairs)
    for i, (slot, reset) in enumerate(pairs):
        assert reset != slot
        if layers > 1:
            assert reset == pairs[(i + 1) % layers][0]
            assert slot != pairs[i - 1][0]


def test_the_shape_rule():
    assert joins_o(32, 64, 512) and joins_o(4, 16, 32)
    assert not joins_o(32, 64, 1024)  # a longer cache than measured
    assert not joins_o(12, 64, 512)  # o's row not a power of two: not one tile
    assert not joins_o(64, 128, 512)  # 8,192 columns: more than a program holds


def test_the_cuda_target_asks_for_the_join_only_with_its_flag(monkeypatch, tmp_path):
    """Its decode pass is built with the generation facet's ``attention_o`` (on)."""
    import dataclasses

    from targets.aoti.cuda import CudaTarget
    from targets.aoti.kernels import ops
    from targets.base import LowerOptions
    if not ops.TRITON:
        pytest.skip("the cuda target places its decode kernels only with Triton installed")
    target = CudaTarget()
    options = LowerOptions(tmp_path)

    def asked():
        return [p.attention_o for p in target.default_passes(options)
                if p.name == "row_linears_as_kernels"]
    assert asked() == [True]
    monkeypatch.setattr(CudaTarget, "generation",
                        dataclasses.replace(CudaTarget.generation, attention_o=False))
    assert asked() == [False]
