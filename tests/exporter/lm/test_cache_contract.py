"""A generating step's cache contract per family, in eager PyTorch: prefill in chunks and
decode over the runtime's KV cache give Hugging Face's tokens, and the step's attention
(grouped in place, the fused op, SDPA) computes the plain step."""

from __future__ import annotations

import collections

import pytest
import torch

from exporter.lm.wrapper import ExportableCausalLM, probe_layout
from runtime.generation.cache import KvCache
from tests.models import tiny_lm

pytest.importorskip("transformers")


# make test runs one family per cache shape (full layers, rings, mixed layers, absolute
# positions); make test-slow runs all nine.
FAST_FAMILIES = ("llama", "mistral", "gemma3", "gpt2", "deepseek_v3", "llama4-temperature",
                 "diffllama")


@pytest.mark.parametrize("family", [f if f in FAST_FAMILIES else
                                    pytest.param(f, marks=pytest.mark.slow)
                                    for f in (*tiny_lm.FAMILIES, "deepseek_v3",
                                              "llama4-temperature", "diffllama",
                                              "gemma4-kv-shared")])
def test_cache_contract_matches_hf_generate(family):
    """Prefill in chunks of 8 then decode with the runtime's cache gives Hugging Face's
    greedy tokens: full layers, rings (prompt and generation cross the window of 12),
    mixed layers, GQA, GPT-2's absolute positions, DeepSeek-V3's cached latents (its
    attention is the model's own: the cache rows are not its keys), Llama 4's temperature
    by position (read from the cache's length in every chunk and step), DiffLlama's
    differential attention (its values are not the cache's rows), Gemma 4's KV sharing
    (layers with no cache of their own attend with an earlier layer's rows)."""
    model = tiny_lm.model(family)
    prompt = torch.randint(3, tiny_lm.VOCAB, (1, 21), generator=torch.Generator().manual_seed(1))
    from exporter.lm.validate import hf_greedy
    reference = hf_greedy(model, prompt[0].tolist(), 24)
    layout = probe_layout(model, 64, torch.float32)
    wrapper, cache = ExportableCausalLM(model, layout), KvCache(layout, "cpu")
    past = {name.removeprefix("past_"): buffer for name, buffer in cache.buffers.items()}
    tokens, position, ids = [], 0, prompt[0]
    with torch.no_grad():
        while position < len(ids):
            chunk = ids[position:position + 8]
            positions = torch.arange(position, position + len(chunk))
            out = wrapper(chunk[None], positions, past)
            cache.write(positions, out)
            position += len(chunk)
        for _ in range(24):
            tokens.append(int(out["logits"][0, -1].argmax()))
            positions = torch.tensor([position])
            out = wrapper(torch.tensor([[tokens[-1]]]), positions, past)
            cache.write(positions, out)
            position += 1
    assert tokens == reference


def test_layers_that_share_kv_get_no_cache_and_attend_with_the_writers_rows():
    """Gemma 4's last layers reuse an earlier layer's keys and values (KV sharing): they
    were refused ("some layers never wrote to the KV cache"). Now only the writers get
    buffers, named by their layer, and a step over the cache gives the full forward's
    logits, the sharing layers attending in place with the writers' rows. (Generation
    token for token: the slow cache-contract case gemma4-kv-shared.)"""
    from exporter.lm import attention
    model = tiny_lm.model("gemma4-kv-shared")
    layout = probe_layout(model, 64, torch.float32)
    assert [layer.layer for layer in layout.layers] == [0, 1]  # 4 layers, 2 writers
    wrapper, cache = ExportableCausalLM(model, layout), KvCache(layout, "cpu")
    past = {name.removeprefix("past_"): buffer for name, buffer in cache.buffers.items()}
    ids = torch.randint(3, tiny_lm.VOCAB, (1, 15), generator=torch.Generator().manual_seed(2))
    calls = collections.Counter()
    real = attention.grouped_attention

    def counting(*args, **kwargs):
        calls["in place"] += 1
        return real(*args, **kwargs)
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention, "grouped_attention", counting)
        out = wrapper(ids[:, :14], torch.arange(14), past)
        cache.write(torch.arange(14), out)
        step = wrapper(ids[:, 14:], torch.tensor([14]), past)["logits"][0, -1]
        full = model(ids).logits[0, -1]
    torch.testing.assert_close(step, full, rtol=1e-4, atol=1e-4)
    assert calls["in place"] == 2 * 4  # every layer, the sharing ones too, both calls


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2"])
def test_the_step_reads_the_cache_in_place(family):
    """The exported step attends over the past slots as they are: no copy of a layer's
    cache by a concatenation with the new rows or by repeating its key/value heads
    (exporter/lm/attention.py), and its logits are those of transformers' own attention."""
    model = tiny_lm.model(family)
    layout = probe_layout(model, 32, torch.float32)
    wrapper = ExportableCausalLM(model, layout).eval()
    past = {f"{kind}_{i}": torch.randn(1, *shape[:1], layer.slots, shape[1])
            for i, layer in enumerate(layout.layers)
            for kind, shape in (("k", layer.key_shape), ("v", layer.value_shape))}
    ids, positions = torch.tensor([[5, 7]]), torch.tensor([9, 10])
    program = torch.export.export(wrapper, (ids, positions, past), strict=False)
    program.graph.eliminate_dead_code()  # as the build's first pass does: transformers'
    # cat(past, new), handed to the attention and unused there, goes
    past_inputs = {node for node in program.graph.nodes
                   if node.op == "placeholder" and "past" in node.name}
    copies = [f"{node.target} of {[a.name for a in past_inputs if a in node.all_input_nodes]}"
              for node in program.graph.nodes if node.op == "call_function"
              and set(node.all_input_nodes) & past_inputs
              and any(word in str(node.target) for word in ("cat", "expand", "repeat", "clone"))]
    assert len(past_inputs) == 2 * len(layout.layers) and not copies
    import exporter.lm.attention as attention
    with torch.no_grad():
        ours = wrapper(ids, positions, past)["logits"]
        real = attention._layer_of
        attention._layer_of = lambda *args: None  # every call takes the model's own path
        try:
            theirs = wrapper(ids, positions, past)["logits"]
        finally:
            attention._layer_of = real
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-4)
    assert not torch.equal(ours, theirs)  # two computations, not one path twice


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2"])
def test_the_fused_attention_op_computes_the_plain_step(family):
    """With "fused" attention (what the onnx target asks for) each full-attention layer
    is one ``edge_exporter::cached_attention`` call and a sliding ring keeps the plain
    math; the logits are the plain step's, at a start where slots are empty and full."""
    model = tiny_lm.model(family)
    layout = probe_layout(model, 32, torch.float32)
    past = {f"{kind}_{i}": torch.randn(1, *shape[:1], layer.slots, shape[1])
            for i, layer in enumerate(layout.layers)
            for kind, shape in (("k", layer.key_shape), ("v", layer.value_shape))}
    ids, positions = torch.tensor([[5, 7, 11]]), torch.tensor([13, 14, 15])
    plain = ExportableCausalLM(model, layout).eval()
    fused = ExportableCausalLM(model, layout, attention="fused").eval()
    program = torch.export.export(fused, (ids, positions, past), strict=False)
    calls = [n for n in program.graph.nodes if "cached_attention" in str(n.target)]
    full = [layer for layer in layout.layers if layer.window is None]
    assert len(calls) == len(full) > 0
    with torch.no_grad():
        torch.testing.assert_close(fused(ids, positions, past)["logits"],
                                   plain(ids, positions, past)["logits"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", [f if f in (*FAST_FAMILIES, "gemma2") else
                                    pytest.param(f, marks=pytest.mark.slow)
                                    for f in tiny_lm.FAMILIES])
def test_the_sdpa_step_computes_the_plain_step(family):
    """With "sdpa" attention (what the cuda target asks for) a layer's attention is one
    SDPA call with grouped-query heads, no repeated key/value heads (a softcap, Gemma 2's,
    keeps the model's own); the logits are the plain step's, for a prompt and one token."""
    model = tiny_lm.model(family)
    layout = probe_layout(model, 32, torch.float32)
    past = {f"{kind}_{i}": torch.randn(1, *shape[:1], layer.slots, shape[1])
            for i, layer in enumerate(layout.layers)
            for kind, shape in (("k", layer.key_shape), ("v", layer.value_shape))}
    plain = ExportableCausalLM(model, layout).eval()
    sdpa = ExportableCausalLM(model, layout, attention="sdpa").eval()
    for ids, positions in ((torch.tensor([[5, 7, 11]]), torch.tensor([13, 14, 15])),
                           (torch.tensor([[9]]), torch.tensor([30]))):
        program = torch.export.export(sdpa, (ids, positions, past), strict=False)
        ops = collections.Counter(str(n.target) for n in program.graph.nodes
                                  if n.op == "call_function")
        calls = sum(n for op, n in ops.items() if "scaled_dot_product" in op)
        assert calls == (0 if family == "gemma2" else len(layout.layers))
        with torch.no_grad():
            torch.testing.assert_close(sdpa(ids, positions, past)["logits"],
                                       plain(ids, positions, past)["logits"],
                                       rtol=1e-5, atol=1e-5)
