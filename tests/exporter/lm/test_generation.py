"""Generating builds (--task text-generation): the validation record, --dry-run's two entry
points, quantized builds on cpu and onnx, tvm. The cache contract in eager:
test_cache_contract.py; the gate and bisect: test_generation_gate.py; what a build
refuses: test_generating_limits.py. Generating with the artifact:
tests/runtime/test_generate_runtime.py; its ONNX inside:
tests/targets/onnx/test_generation_onnx.py."""

from __future__ import annotations

import json

import pytest
import torch

import exporter
import runtime
from tests.conftest import ROOT
from tests.models import tiny_lm

pytest.importorskip("transformers")


def test_validation_generates_like_hugging_face(onnx_lm):
    built, _ = onnx_lm
    record = built.manifest.validation
    assert record["passed"] and record["kind"] == "generation"
    assert record["tokens_identical"] and record["cases"] == 4
    lengths = [row["prompt_tokens"] for row in record["outputs"]]
    assert lengths[0] == 1 and max(lengths) > 16  # decode-only prompt; chunked prefill
    last = record["outputs"][-1]  # the last generates up to the context's last position
    assert last["prompt_tokens"] + last["new_tokens"] == built.manifest.generation.max_context
    for row in record["outputs"]:
        assert row["cache_consistency"]["passed"], row["cache_consistency"]
        assert row["cache_consistency"]["decode_vs_prefill_max_abs_err"] < 1e-4


def test_dry_run_places_both_entry_points(onnx_lm, cli_here):
    """--dry-run on a generating build: prefill's placement and signature, and decode's,
    nothing compiled."""
    built, _ = onnx_lm
    folder = built.artifact.parent / "tiny-gemma3"
    done = cli_here("build", f"hf:{folder}", "--task", "text-generation", "--target", "cpu",
                    "--max-context", "32", "--prefill-chunk", "8", "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    ids = data["signature"]["inputs"][0]
    assert ids["name"] == "input_ids" and ids["shape"][1]["max"] == 8
    decode = data["entry_points"]["decode"]
    assert decode["signature"]["inputs"][0]["shape"] == [1, 1]
    assert decode["placement"]["ops"] > 0


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


# make test-slow: the experts' pass runs in make test in tests/passes/test_quantize_experts.py,
# a generating onnx build in onnx_lm's tests
@pytest.mark.parametrize("target,recipe", [
    pytest.param("onnx", "int8-weight", marks=pytest.mark.slow),
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


@pytest.mark.slow  # ~30 s of TVM compiles
def test_tvm_generating_build_validates_token_for_token(tmp_path):
    """The tvm target builds generating artifacts too (README: untimed), tokens equal to
    transformers'."""
    built = exporter.build(f"{ROOT / 'tests' / 'models' / 'tiny_lm.py'}:factory",
                           task="text-generation", target="tvm", max_context=32,
                           out=tmp_path / "llama-tvm.artifact")
    record = built.manifest.validation
    assert record["passed"] and record["tokens_identical"]


@pytest.mark.parametrize("quantize, shared", [(None, True), ("int8-dynamic", False)])
def test_generating_passes_know_the_entry_points_share_their_weights(monkeypatch, quantize,
                                                                      shared):
    """A target's passes may differ for generating builds (cuda keeps a decode step's
    one-row linears on its row kernels, targets/aoti/cuda.py): they read
    ``options.shared_weights``, which was set only at lowering, after the passes had run
    with it False. A dry run on cpu: the options each entry point's passes were given say
    what the target shares (not its PT2E int8 recipes, which one program then serves)."""
    from exporter.lm.build import dry_run_generating
    from exporter.settings import BuildSettings
    from targets import get_target
    target = type(get_target("cpu"))
    seen = []
    passes = target.default_passes
    monkeypatch.setattr(target, "default_passes",
                        lambda self, options: seen.append(options) or passes(self, options))
    torch.manual_seed(0)
    model = tiny_lm.one_layer()
    planned = dry_run_generating(model, BuildSettings(target="cpu", task="text-generation",
                                                      max_context=32, quantize=quantize))
    assert seen and [o.shared_weights for o in seen] == [shared] * len(seen)
    assert all(p.options.shared_weights == shared for p in planned.preps.values())
