"""passes/attention_store.py: the decode pass chooses the attention that stores the step's
new K/V rows only where the target asks (``store_rows``) and only in one-token steps; the
step then computes what it did, leaves each row at its slot of the step's own cache
buffers, and names those outputs for the partition's meta. On the CPU, through the ops'
reference kernels."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.kernels import ops
from targets.aoti.passes.attention_store import stored_outputs
from targets.aoti.passes.decode_kernels import DecodeAttentionAsKernel, RowLinearsAsKernels
from tests.targets.aoti.test_decode_kernels import _calls, _captured, _randomised

pytest.importorskip("transformers")

STORE = "edge_exporter.decode_attention_store.default"
PLAIN = "edge_exporter.decode_attention.default"


@pytest.mark.parametrize("family,position", [("llama", 9), ("mistral", 20)])
def test_a_one_token_step_stores_its_rows_where_the_cache_write_would(family, position):
    """llama (full cache) and mistral (a ring of its window, wrapped round at 20): every
    layer's attention stores, the step's outputs are what they were, each past buffer
    holds the step's new row at ``position % slots`` and is otherwise unchanged, and the
    stored outputs are the k_i/v_i the runtime would have written."""
    program, past = _captured(family, 1)
    attention = DecodeAttentionAsKernel(store_rows=True)(program)
    result = RowLinearsAsKernels()(attention.program)
    layers = 2
    assert attention.info["rows_stored"] == layers
    calls = _calls(result.program)
    assert calls[STORE] == layers and not calls[PLAIN]
    stores = [n for n in result.program.graph.nodes if str(n.target) == STORE]
    assert len({n.args[9] for n in stores}) == 1 and stores[0].args[9].op == "placeholder"
    assert len({n.args[8] for n in stores}) == 1  # the join's counts, one buffer for all
    names = result.program.graph_signature.user_outputs
    assert stored_outputs(result.program) == tuple(range(1, 1 + 2 * layers))
    assert len(names) == 1 + 2 * layers

    cache = _randomised(past)
    ids, positions = torch.tensor([[7]]), torch.tensor([position])
    with torch.no_grad():
        want = program.module()(ids, positions, {k: v.clone() for k, v in cache.items()})
        buffers = {k: v.clone() for k, v in cache.items()}
        got = result.program.module()(ids, positions, *buffers.values())
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-4)
    for name, buffer in buffers.items():  # past "k_0": exactly the step's output "k_0"
        slot = position % buffer.shape[2]
        expected = cache[name].clone()
        expected[:, :, slot] = got[name][:, :, 0]
        assert torch.equal(buffer, expected), name


def test_without_the_flag_the_attention_stores_nothing():
    program, _ = _captured("llama", 1)
    result = DecodeAttentionAsKernel()(program)
    assert "rows_stored" not in result.info
    assert not _calls(result.program)[STORE] and _calls(result.program)[PLAIN] == 2
    assert stored_outputs(result.program) == ()


def test_prompt_chunks_store_nothing_even_with_the_flag():
    """A prefill step (rows of dynamic length) keeps SDPA and the runtime's cache write."""
    program, _ = _captured("llama", 4)
    result = DecodeAttentionAsKernel(store_rows=True)(program)
    assert not result.modified and not _calls(result.program)[STORE]


def test_a_step_whose_rows_are_not_returned_as_they_are_stores_nothing():
    """The kernel stores the op's new rows; where the step returns other values for
    them (here the key scaled after the attention read it) the cache write must stay."""
    from passes.graph.rewrite import recapture
    from targets.aoti.passes.attention_store import store_new_rows
    program, _ = _captured("llama", 1)
    joined = DecodeAttentionAsKernel()(program).program
    module = joined.module()
    output = next(n for n in module.graph.nodes if n.op == "output")
    first = next(n for n in module.graph.nodes if str(n.target) == PLAIN)
    key = first.args[2]
    with module.graph.inserting_before(output):
        other = module.graph.call_function(torch.ops.aten.mul.Tensor, (key, 2.0))
    output.replace_input_with(key, other)
    module.recompile()
    assert store_new_rows(module) == 1  # the other layer's rows still are its outputs
    module.recompile()
    assert stored_outputs(recapture(module, joined)) == (3, 4)


def test_the_cuda_target_asks_for_the_store_only_with_its_flag(monkeypatch, tmp_path):
    """Its decode pass is built with the generation facet's ``store_rows`` (on)."""
    import dataclasses

    from targets.aoti.cuda import CudaTarget
    from targets.base import LowerOptions
    if not ops.TRITON:
        pytest.skip("the cuda target places its decode kernels only with Triton installed")
    target = CudaTarget()
    options = LowerOptions(tmp_path)
    found = [p for p in target.default_passes(options) if p.name == "decode_attention_as_kernel"]
    assert [p.store_rows for p in found] == [True]
    monkeypatch.setattr(CudaTarget, "generation",
                        dataclasses.replace(CudaTarget.generation, store_rows=False))
    found = [p for p in target.default_passes(options) if p.name == "decode_attention_as_kernel"]
    assert [p.store_rows for p in found] == [False]
