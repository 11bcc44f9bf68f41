"""Text generation (--task text-generation): the cache contract per family (eager), a
generating build's validation and what it refuses before capture, and the generation
gate's divergence report. Generating with the artifact: tests/runtime/test_generate_runtime.py;
its ONNX inside: tests/targets/onnx/test_generation_onnx.py."""

from __future__ import annotations

import collections
import json

import pytest
import torch

import exporter
import runtime
from exporter.lm.wrapper import ExportableCausalLM, probe_layout
from runtime.generation.cache import KvCache
from tests.conftest import ROOT
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
    print(family, [layer.window for layer in layout.layers], tokens[:8])
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
    print("max |step - full|", float((step - full).abs().max()), dict(calls))
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
    print(family, len(past_inputs), "cache inputs; copies of them:", copies)
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
    print(family, "layers", [layer.window for layer in layout.layers], "op calls", len(calls))
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
        print(family, ids.shape[1], "tokens: SDPA calls", calls, "expands",
              ops["aten.expand.default"])
        assert calls == (0 if family == "gemma2" else len(layout.layers))
        with torch.no_grad():
            torch.testing.assert_close(sdpa(ids, positions, past)["logits"],
                                       plain(ids, positions, past)["logits"],
                                       rtol=1e-5, atol=1e-5)


def test_validation_generates_like_hugging_face(onnx_lm):
    built, program = onnx_lm
    record = built.manifest.validation
    print(json.dumps({k: record[k] for k in ("passed", "cases", "tokens_identical",
                                             "top1_agreement", "mean_kl")}))
    assert record["passed"] and record["kind"] == "generation"
    assert record["tokens_identical"] and record["cases"] == 4
    lengths = [row["prompt_tokens"] for row in record["outputs"]]
    assert lengths[0] == 1 and max(lengths) > 16  # decode-only prompt; chunked prefill
    last = record["outputs"][-1]  # the last generates up to the context's last position
    assert last["prompt_tokens"] + last["new_tokens"] == built.manifest.generation["max_context"]
    for row in record["outputs"]:
        assert row["cache_consistency"]["passed"], row["cache_consistency"]
        assert row["cache_consistency"]["decode_vs_prefill_max_abs_err"] < 1e-4


def test_int8_static_is_refused_for_generating_builds(cli, tmp_path):
    """It calibrates on one forward pass's inputs; a step's are cache states (ONNX
    Runtime's attention op refused random positions): exit 2 before any capture."""
    out = tmp_path / "x.artifact"
    done = cli("build", f"{ROOT / 'tests' / 'models' / 'tiny_lm.py'}:factory", "--task",
               "text-generation", "--target", "onnx", "--quantize", "int8-static",
               "--calibration", "random", "--out", str(out))
    print(done.stderr)
    assert done.returncode == 2 and "int8-static does not apply" in done.stderr
    assert "int8-dynamic" in done.stderr and not out.exists()


def test_models_that_cannot_generate_from_a_cache_are_refused_before_capture(cli, tmp_path):
    """An encoder loaded as a causal LM (BERT: BertLMHeadModel) attends both ways, ALiBi
    (BLOOM) builds its biases from a 2D mask over the whole sequence, and a tokenizer.json
    that does not load would fail only at validation: each exits 2 at load, naming it."""
    import shutil

    import transformers
    torch.manual_seed(0)
    bert = tmp_path / "bert-mlm"
    transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=120, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64)).save_pretrained(bert)
    bloom = tmp_path / "bloom"
    transformers.BloomForCausalLM(transformers.BloomConfig(
        vocab_size=120, hidden_size=32, n_layer=1, n_head=2)).save_pretrained(bloom)
    folder = tiny_lm.checkpoint(tmp_path / "lm", "llama")
    broken = shutil.copytree(folder, tmp_path / "broken-tokenizer")
    (broken / "tokenizer.json").write_text('{"version": "1.0", ')
    for spec, said in ((bert, "is not a causal decoder"), (bloom, "uses ALiBi position biases"),
                       (broken, "tokenizer.json cannot be read")):
        out = tmp_path / f"{spec.name}.artifact"
        done = cli("build", f"hf:{spec}", "--task", "text-generation", "--target", "onnx",
                   "--out", str(out))
        print(done.stderr)
        assert done.returncode == 2 and said in done.stderr
        assert "capture" not in done.stderr and not out.exists()


def test_rotaries_that_follow_the_sequence_length(tmp_path):
    """Dynamic-NTK rope branches on the call's last position, which torch.export cannot
    capture; within the model's positions (every --max-context) it is the default rope, and
    builds token for token. Phi-3's longrope past its original context makes transformers
    recompute the whole cache with its long factors: refused (a UserInputError: exit 2,
    naming the limit), and the default context stops at that limit."""
    from exporter.errors import UserInputError
    from exporter.lm.build import dry_run_generating
    from exporter.settings import BuildSettings
    models = ROOT / "tests" / "models" / "tiny_lm.py"
    out = tmp_path / "dynamic.artifact"
    built = exporter.build(f"{models}:llama_dynamic_rope", task="text-generation",
                           target="onnx", max_context=48, out=out)
    record = built.manifest.validation
    print("dynamic rope", record["passed"], record["tokens_identical"])
    assert record["passed"] and record["tokens_identical"]
    with pytest.raises(UserInputError, match="original context of 32") as refused:
        exporter.build(f"{models}:phi3_longrope", task="text-generation", target="onnx",
                       max_context=40, out=tmp_path / "x")
    assert "--max-context 32 or less" in str(refused.value)
    planned = dry_run_generating(f"{models}:phi3_longrope",
                                 BuildSettings(target="onnx", task="text-generation"))
    assert planned.context == 32  # the default context
    planned = dry_run_generating(f"{models}:gemma3_longrope",  # longrope per layer type
                                 BuildSettings(target="onnx", task="text-generation"))
    assert planned.context == 32


def test_gate_names_the_first_divergence():
    """fp32: tokens that differ where eager is not at a tie fail, naming prompt, step,
    both tokens and the logit error there (exporter/lm/gate.py on made-up results)."""
    from exporter.lm.gate import GenerationGate, judge_case, summary_lines

    vocab, count = 16, 4
    eager_logits = torch.randn(count, vocab, generator=torch.Generator().manual_seed(0),
                               dtype=torch.float64) * 3

    class Eager:  # stands in for the model's full forward (our own function under test)
        note = None  # its float64 forward ran

        def at(self, sequence, start, n, *, float64=False, encoder=None):
            return eager_logits[:n]

    reference = eager_logits.argmax(-1).tolist()
    got_logits = eager_logits.clone().float()
    got_logits[2, 0] = 50.0  # step 2 picks token 0
    tokens = got_logits.argmax(-1).tolist()
    gate = GenerationGate.for_build("fp32", None)
    row = judge_case("case0", Eager(), [1, 2], reference,
                     {"tokens": torch.tensor(tokens), "logits": got_logits,
                      "consistency": got_logits[1]}, gate)
    record = gate.record([row], count)
    lines = summary_lines(record)
    print("\n".join(lines))
    assert not record["passed"]
    assert record["first_divergence"]["step"] == 2 and not record["first_divergence"]["tie"]
    assert "case0 step 2" in lines[1] and "artifact token 0" in lines[1]


def test_dry_run_places_both_entry_points(onnx_lm, cli):
    """--dry-run on a generating build: prefill's placement and signature, and decode's,
    nothing compiled."""
    built, _ = onnx_lm
    folder = built.artifact.parent / "tiny-gemma3"
    done = cli("build", f"hf:{folder}", "--task", "text-generation", "--target", "cpu",
               "--max-context", "32", "--prefill-chunk", "8", "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    ids = data["signature"]["inputs"][0]
    assert ids["name"] == "input_ids" and ids["shape"][1]["max"] == 8
    decode = data["entry_points"]["decode"]
    assert decode["signature"]["inputs"][0]["shape"] == [1, 1]
    assert decode["placement"]["ops"] > 0


def test_a_prefill_chunk_over_the_context_is_refused(onnx_lm):
    """Not cut down to the context in silence: the user asked for something else."""
    from exporter.errors import SpecError
    from exporter.lm.source import load_language_model
    from exporter.model.hf_spec import HfOptions
    built, _ = onnx_lm
    lm = load_language_model(f"hf:{built.artifact.parent / 'tiny-gemma3'}",
                             HfOptions(task="text-generation"))
    assert lm.context_bounds(32, 32) == (32, 32) and lm.context_bounds(32, None) == (32, 32)
    with pytest.raises(SpecError, match="--prefill-chunk 64 is over the context of 32"):
        lm.context_bounds(32, 64)


def test_gate_bounds_are_the_users_when_given():
    from exporter.lm.gate import GenerationGate
    default = GenerationGate.for_build("fp32", "int4-weight")
    given = GenerationGate.for_build("fp32", "int4-weight", min_top1=0.0, max_kl=10.0)
    assert (default.min_top1, default.max_kl) == (0.70, 0.20)
    assert (given.min_top1, given.max_kl) == (0.0, 10.0) and "--max-kl" in given.failure()


@pytest.mark.skipif(not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"),
                    reason="this torch has no ATen int4 CPU GEMM")
@pytest.mark.slow  # ~50 s of AOTInductor builds: `make test` reached 14m44s of its 15 with it
@pytest.mark.parametrize("recipe", ["int4-weight", "int8-dynamic"])
def test_cpu_quantized_generating_build(tmp_path_factory, recipe):
    """int4-weight on cpu: every linear on ATen's int4 GEMM and the token table in int8
    rows, in both entry points, whose weights live outside the libraries (the GEMM's group
    size is a constant Inductor makes itself, which the shared store must carry).
    int8-dynamic: every linear on oneDNN's int8 GEMM, which needs frozen weights packed
    into the library (targets/aoti/base.py shares_weights), so one program is prefill and
    decode: a decode program of its own doubled the file. Prefill and decode agree
    through the cache. The tiny random model misses the default int4
    gate as ONNX Runtime's MatMulNBits does on it (top-1 0.50 here, 0.46 there), so the
    test sets its own."""
    from exporter.report.console import quantization_records
    folder = tiny_lm.checkpoint(tmp_path_factory.mktemp("lm") / "tiny-llama", "llama")
    out = folder.parent / f"tiny-llama-cpu-{recipe}.artifact"
    built = exporter.build(f"hf:{folder}", task="text-generation", target="cpu",
                           quantize=recipe, max_context=64, prefill_chunk=16,
                           min_top1=0.3, max_kl=0.5, out=out)
    record = built.manifest.validation
    (info, *_) = quantization_records(built.manifest)
    consistency = [row["decode_vs_prefill_max_abs_err"] for row in record["outputs"]]
    print(json.dumps({"top1": record["top1_agreement"], "kl": record["mean_kl"],
                      "quantized": len(info["layers_quantized"]),
                      "bytes": [info["weight_bytes_before"], info["weight_bytes_after"]],
                      "shared_weights": built.manifest.shared_weights is not None,
                      "decode_vs_prefill": consistency}))
    # 4 linears a layer + lm_head, and the token table in int8 rows
    assert record["passed"] and len(info["layers_quantized"]) == 9 + 1
    assert {layer.split(":")[0] for layer in info["layers_quantized"]} >= {
        "model.embed_tokens", "lm_head", "model.layers.0.mlp.down_proj"}  # the user's paths
    assert info["layers_float"] == [] and info["weight_bytes_after"] * 3 < info["weight_bytes_before"]
    assert (built.manifest.shared_weights is not None) == (recipe == "int4-weight")
    assert ("decode" in built.manifest.entry_points) == (recipe == "int4-weight")
    # int4: bf16 rows, the same kernel for 1 and for T tokens; int8-dynamic: one activation
    # scale per call (PT2E's X86 default is per tensor), so a chunk's scale differs from
    # a token's (0.13-0.30 here, on logits of std 1.6)
    assert max(consistency) < (0.05 if recipe == "int4-weight" else 1.0)
    result = runtime.load(out).generate("hello world", 8, stop_at_eos=False)
    assert len(result.tokens) == 8


@pytest.mark.parametrize("target,recipe", [
    ("onnx", "int8-weight"),
    # ~3.5 minutes of AOTInductor builds (prefill and decode programs)
    pytest.param("cpu", "int8-dynamic", marks=pytest.mark.slow)])
def test_an_int8_build_quantizes_the_experts_and_stores_them_once(tmp_path, target, recipe):
    """A mixture of experts' experts run on the CPU fallback (no ONNX translation of
    transformers' grouped matmul, nor an Inductor one). --quantize reaches them there
    (int8 per expert and column; passes/quantize/quantize_experts.py): the prefill and decode
    partitions read one copy from the shared store, no float expert is left, the report
    says so, and the gate holds (the tiny random model's own gate, as for the cpu builds
    above). On cpu int8-dynamic the libraries keep their own frozen int8 weights, but the
    fallback's experts are stored once all the same (they were once per entry point)."""
    from exporter.report.console import fallback_float_weights, quantization_records
    folder = tiny_lm.checkpoint(tmp_path / "tiny-mixtral", "mixtral")
    built = exporter.build(f"hf:{folder}", task="text-generation", target=target,
                           quantize=recipe, max_context=32, prefill_chunk=8,
                           min_top1=0.3, max_kl=0.5, out=tmp_path / "moe.artifact")
    manifest = built.manifest
    experts = [info for info in quantization_records(manifest) if "expert" in info["how"]]
    store = {key: spec for index in manifest.shared_weights["entries"].values()
             for key, spec in index.items()}
    fallback = [p for entry in [manifest, *manifest.entry_points.values()]
                for p in entry.partitions if p.backend == "torch"]
    read = [set(p.meta["shared_weights"].values()) for p in fallback]
    print(json.dumps({"experts": experts[0]["layers_quantized"],
                      "bytes": [experts[0]["weight_bytes_before"],
                                experts[0]["weight_bytes_after"]],
                      "fallback": [p.name for p in fallback],
                      "top1": manifest.validation["top1_agreement"]}))
    assert manifest.validation["passed"]
    assert len(experts) == 1 and len(experts[0]["layers_quantized"]) == 2 * 2  # 2 layers
    assert experts[0]["weight_bytes_after"] * 3.5 < experts[0]["weight_bytes_before"]
    assert fallback_float_weights(manifest) is None  # nothing left in float there
    assert any(p.name.startswith("decode") for p in fallback) and len(fallback) > 2
    prefill_keys = set().union(*(k for p, k in zip(fallback, read) if not p.name.startswith("decode")))
    decode_keys = set().union(*(k for p, k in zip(fallback, read) if p.name.startswith("decode")))
    assert prefill_keys == decode_keys  # one copy for both entry points
    assert {store[k][0] for k in prefill_keys} == {"I8", "F32"}  # values, scales
    assert not any(p.meta.get("weights") for p in fallback)  # none in a file of its own


def test_a_divergence_is_bisected_to_the_op_that_parts_from_eager(cli, tmp_path):
    """An fp32 generating build that does not generate transformers' tokens says where:
    the step of the first divergence is re-created (the cache filled eagerly), bisected to
    a partition and, inside ONNX Runtime's, to the first value that differs: here the
    router's TopK breaking a tie of all-underflowed scores as torch.topk does not."""
    out = tmp_path / "tie.artifact"
    done = cli("build", f"{ROOT / 'tests' / 'models' / 'tie_router.py'}:factory",
               "--task", "text-generation", "--target", "onnx", "--max-context", "32",
               "--json", "--out", str(out))
    print(done.stderr[-1500:])
    assert done.returncode == 1 and not out.exists()
    found = json.loads(done.stdout)["validation"]["bisect"]
    assert found["first_divergent"] is not None and "step" in found["case"]
    inside = found["inside"]
    assert inside["backend_op"] == "TopK" and "modeling_afmoe.py" in inside["source"]
    assert "<- first to diverge" in done.stderr and "onnxruntime op TopK" in done.stderr
    kl = json.loads(done.stdout)["validation"]["mean_kl"]
    assert isinstance(kl, float) and kl < 1  # finite: the router's + 1e-20 survived the export


def test_a_model_that_fails_eagerly_is_said_so_with_its_line(tmp_path):
    """AFMoE's masks need a sliding_window in its config: without one the model raises on
    any input. That is the model's (exit 2, its line), not 'an internal error' (exit 4)."""
    import transformers as tf

    from exporter.errors import SpecError
    config = tf.AfmoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                            head_dim=16, num_experts=2, num_experts_per_tok=1,
                            moe_intermediate_size=16, sliding_window=None)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(SpecError, match="fails in eager PyTorch") as info:
        exporter.build(model, task="text-generation", target="onnx", max_context=16,
                       out=tmp_path / "a.artifact")
    print(info.value)
    assert "sliding_window" in str(info.value) and "masking_utils.py" in str(info.value)


def test_the_float64_reference_runs_mixture_of_experts_models():
    """transformers' default experts kernel (grouped_mm) has no float64 kernel: the
    exact-tokens gate's float64 reference of Qwen2-MoE failed before it ran."""
    import transformers as tf

    from exporter.lm.gate import EagerLogits
    torch.manual_seed(0)
    config = tf.Qwen2MoeConfig(vocab_size=tiny_lm.VOCAB, hidden_size=64, intermediate_size=128,
                               num_hidden_layers=1, num_attention_heads=4,
                               num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                               moe_intermediate_size=32, shared_expert_intermediate_size=64)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    eager = EagerLogits(model)
    l32, l64 = eager.at([5, 6, 7, 8], 1, 3), eager.at([5, 6, 7, 8], 1, 3, float64=True)
    print("max |float32 - float64| logit:", float((l32.double() - l64).abs().max()))
    assert l64.dtype == torch.float64 and l64.shape == (3, tiny_lm.VOCAB)
    torch.testing.assert_close(l32.double(), l64, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # ~30 s of TVM compiles
def test_tvm_generating_build_validates_token_for_token(tmp_path):
    """The tvm target builds generating artifacts too (README: untimed), tokens equal to
    transformers'."""
    built = exporter.build(f"{ROOT / 'tests' / 'models' / 'tiny_lm.py'}:factory",
                           task="text-generation", target="tvm", max_context=32,
                           out=tmp_path / "llama-tvm.artifact")
    record = built.manifest.validation
    print(record["passed"], record["tokens_identical"], sorted(built.manifest.entry_points))
    assert record["passed"] and record["tokens_identical"]


def test_a_tokenizer_larger_than_the_vocabulary_is_a_note_and_the_validation_stays_inside(
        tmp_path):
    """A tokenizer.json of more tokens than the model's vocabulary: the validation's text
    prompts indexed past the embedding table (exit 4, "IndexError"). Now a note, and the
    prompts keep only ids the model has."""
    from types import SimpleNamespace

    from exporter.lm.source import _check_tokenizer
    from exporter.lm.validate import _tokenized
    path = tmp_path / "tokenizer.json"
    tokenizer = tiny_lm.bpe_tokenizer(tiny_lm.VOCAB, ["<pad>", "<s>", "</s>"], "<s> $A")
    tokenizer.save(str(path))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    assert _check_tokenizer(path, size) == []
    (note,) = _check_tokenizer(path, 200)
    prompts = _tokenized(SimpleNamespace(tokenizer=path), 200)
    print(note, [max(p) for p in prompts])
    assert f"has {size} tokens, the model's vocabulary 200" in note
    assert all(p and max(p) < 200 for p in prompts)


def test_layers_without_a_kv_cache_are_refused_as_the_models_limit():
    """Linear-attention (Qwen3-Next, Jamba, Mamba 2 hybrids) and chunked (Llama 4) layers
    were "an internal error ... a bug in the exporter"; they are a limit of the export:
    exit 2 (a SpecError) naming the layer kind, before any capture."""
    from exporter.errors import SpecError
    from exporter.lm.build import dry_run_generating
    from exporter.settings import BuildSettings
    lm = tiny_lm.model("llama")
    lm.config.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(SpecError, match="linear_attention layers have no KV-cache export"):
        dry_run_generating(lm, BuildSettings(target="onnx", task="text-generation"))
