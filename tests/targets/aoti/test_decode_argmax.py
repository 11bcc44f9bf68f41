"""A greedy decode step's token taken inside its head's kernel (targets/aoti/passes/
decode_argmax.py): the step that returns its next token gets row_gemv_argmax in place of
its head and torch's argmax, and computes what it did (on the CPU, through the op's
reference kernel; the kernel itself: test_head_argmax.py)."""

from __future__ import annotations

import collections

import pytest
import torch

from targets.aoti.passes.decode_kernels import DecodeAttentionAsKernel, RowLinearsAsKernels
from tests.targets.aoti.test_decode_kernels import _captured, _randomised

pytest.importorskip("transformers")

HEAD = "edge_exporter.row_gemv_argmax.default"


def _calls(program) -> collections.Counter:
    return collections.Counter(str(n.target) for n in program.graph.nodes
                               if n.op == "call_function")


def _outputs(program, past, flat: bool):
    cache = _randomised(past)
    ids, position = torch.tensor([[7]]), torch.tensor([9])
    with torch.no_grad():
        return (program.module()(ids, position, *cache.values()) if flat
                else program.module()(ids, position, cache))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_heads_argmax_becomes_the_token_of_its_kernel(dtype):
    program, past = _captured("llama", 1, dtype, next_token=True)
    attention = DecodeAttentionAsKernel()(program).program
    result = RowLinearsAsKernels()(attention)
    assert result.info["argmax_in_head"] == 1 and result.info["norms_folded"] == 5
    calls = _calls(result.program)
    assert calls[HEAD] == 1 and "aten.argmax.default" not in calls
    head = next(n for n in result.program.graph.nodes if str(n.target) == HEAD)
    assert head.args[3] is not None  # the final norm folded in
    want, got = _outputs(program, past, False), _outputs(result.program, past, True)
    assert list(got) == list(want) and list(got)[-1] == "next_token"
    assert got["next_token"].dtype == torch.int64 and got["next_token"].shape == (1,)
    assert int(got["next_token"]) == int(got["logits"][0, -1].argmax())
    assert int(got["next_token"]) == int(want["next_token"])
    close = 1e-4 if dtype == torch.float32 else 1e-2
    for name in want:
        torch.testing.assert_close(got[name].float(), want[name].float(), rtol=close,
                                   atol=close)


def test_an_int8_head_takes_its_token_with_its_scales():
    pytest.importorskip("torchao")
    from passes.quantize.quantize_weight_only import QuantizeWeightOnly
    program, past = _captured("qwen2", 1, torch.float16, next_token=True)
    program = DecodeAttentionAsKernel()(program).program
    quantized = QuantizeWeightOnly("int8-weight", "weight-only", "cuda")(program).program
    result = RowLinearsAsKernels()(quantized)
    assert result.info["argmax_in_head"] == 1 and result.info["int8_linears"] == 9
    head = next(n for n in result.program.graph.nodes if str(n.target) == HEAD)
    assert head.args[6] is not None  # each row's scale
    want, got = _outputs(quantized, past, True), _outputs(result.program, past, True)
    assert int(got["next_token"]) == int(got["logits"][0, -1].argmax())
    torch.testing.assert_close(got["logits"], want["logits"], rtol=1e-2, atol=1e-2)


def test_a_step_without_its_token_keeps_its_head_and_a_prompt_chunk_has_none():
    program, _ = _captured("llama", 1)
    result = RowLinearsAsKernels()(DecodeAttentionAsKernel()(program).program)
    assert result.info["argmax_in_head"] == 0 and HEAD not in _calls(result.program)


def test_the_steps_token_is_its_last_rows_first_maximum_with_the_weights_shared():
    from exporter.lm.wrapper import ExportableCausalLM, probe_layout
    from tests.models import tiny_lm
    model = tiny_lm.model("llama")
    layout = probe_layout(model, 32, torch.float32)
    wrapper = ExportableCausalLM(model, layout, attention="sdpa").eval()
    step = wrapper.with_next_token()
    assert not wrapper.next_token and step.next_token and step.model is wrapper.model
    past = {f"{kind}_{i}": torch.zeros(1, *shape[:1], layer.slots, shape[1])
            for i, layer in enumerate(layout.layers)
            for kind, shape in (("k", layer.key_shape), ("v", layer.value_shape))}
    with torch.no_grad():
        out = step(torch.tensor([[5, 9, 11]]), torch.arange(3), past)
        plain = wrapper(torch.tensor([[5, 9, 11]]), torch.arange(3), past)
    assert "next_token" not in plain
    assert out["next_token"].tolist() == [int(out["logits"][0, -1].argmax())]


def test_only_the_decode_entry_returns_its_token_and_only_where_the_target_asks():
    from types import SimpleNamespace

    from exporter.lm.entries import entry_specs
    from exporter.lm.wrapper import ExportableCausalLM, probe_layout
    from targets import get_target
    from tests.models import tiny_lm
    model = tiny_lm.model("llama")
    layout = probe_layout(model, 32, torch.float32)
    wrapper = ExportableCausalLM(model, layout, attention="sdpa").eval()
    lm = SimpleNamespace(source="tiny", origin_file=None, notes=[])
    specs = entry_specs(lm, wrapper, layout, 16, next_token=True)
    assert specs["decode"].module.next_token and not specs["prefill"].module.next_token
    assert not entry_specs(lm, wrapper, layout, 16)["decode"].module.next_token
    assert list(entry_specs(lm, wrapper, layout, 16, True, True)) == ["prefill"]
    # on for cuda: a ~1.1B build decodes faster with it
    assert get_target("cuda").generation.next_token


def test_only_casts_that_keep_every_value_are_looked_through():
    from targets.aoti.passes.decode_argmax import _widening
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(4, dtype=torch.float16)
    for dtype, kept in ((torch.float32, True), (torch.float16, True),
                        (torch.bfloat16, False)):
        cast = graph.call_function(torch.ops.aten._to_copy.default, (x,), {"dtype": dtype})
        cast.meta["val"] = torch.empty(4, dtype=dtype)
        assert _widening(cast) == kept, dtype
