"""Encoder-decoders under --task text-generation (exporter/lm/seq2seq.py): the contract of
encode + prefill + decode per family in eager (Whisper, BART, Marian, T5), and built
artifacts end to end: validation against Hugging Face generate, generation on sources the
build never saw, both CLIs, and the bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import exporter
import runtime
from exporter.lm.seq2seq import (ExportableEncoder, ExportableSeq2SeqStep, example_source,
                                 probe_seq2seq_layout, source_of)
from exporter.lm.validate import hf_greedy
from runtime.generation.cache import KvCache
from tests.conftest import ROOT
from tests.models import tiny_seq2seq

pytest.importorskip("transformers")
MODELS = ROOT / "tests" / "models" / "tiny_seq2seq.py"


@pytest.mark.parametrize("family", tiny_seq2seq.FAMILIES)
def test_encode_prefill_decode_equal_the_models_forward(family):
    """The cross cache from ``encode`` (a short source in a longer buffer, the rest masked),
    a prefill of 5 decoder tokens and a decode step each give Hugging Face's logits."""
    model = tiny_seq2seq.model(family)
    source = source_of(model, None)
    layout = probe_seq2seq_layout(model, source, 32, torch.float32)
    encoder = ExportableEncoder(model, layout, source).eval()
    step = ExportableSeq2SeqStep(model, layout, source).eval()
    value = example_source(model, source, 7, seed=3)
    cache = KvCache(layout, "cpu", source_mask=source.masked)
    decoder = torch.tensor([[model.config.decoder_start_token_id, 5, 17, 9, 30, 11]])
    with torch.no_grad():
        assert cache.set_source(encoder(value)) == (7 if source.masked else source.bound)
        inputs = {name: cache.buffers[name] for name in cache.buffers}

        def run(ids, positions):
            past = {n.removeprefix("past_"): t for n, t in inputs.items() if "past_" in n}
            cross = {n.removeprefix("cross_"): t for n, t in inputs.items() if "cross_" in n}
            out = step(ids, positions, past, cross, inputs.get("source_mask"))
            cache.write(positions, out)
            return out["logits"]

        prefill = run(decoder[:, :5], torch.arange(5))
        decode = run(decoder[:, 5:], torch.arange(5, 6))
        reference = model(**{model.main_input_name: value}, decoder_input_ids=decoder).logits
    print(family, float((prefill - reference[:, :5]).abs().max()),
          float((decode[0, -1] - reference[0, 5]).abs().max()))
    torch.testing.assert_close(prefill, reference[:, :5], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(decode[0, -1], reference[0, 5], rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def bart_onnx(tmp_path_factory):
    """A BART checkpoint folder with a tokenizer, through hf: (AutoModelForSeq2SeqLM)."""
    folder = tiny_seq2seq.checkpoint(tmp_path_factory.mktemp("s2s") / "tiny-bart")
    out = folder.parent / "tiny-bart-onnx.artifact"
    built = exporter.build(f"hf:{folder}", task="text-generation", target="onnx",
                           max_context=48, prefill_chunk=16, out=out)
    return built, runtime.load(out), folder


@pytest.fixture(scope="module")
def whisper_onnx(tmp_path_factory):
    out = tmp_path_factory.mktemp("s2s") / "tiny-whisper-onnx.artifact"
    built = exporter.build(f"{MODELS}:whisper", task="text-generation", target="onnx",
                           max_context=48, out=out)
    return built, runtime.load(out)


@pytest.mark.parametrize("fixture", ["bart_onnx", "whisper_onnx"])
def test_validation_generates_like_hugging_face(fixture, request):
    built = request.getfixturevalue(fixture)[0]
    record = built.manifest.validation
    print(fixture, json.dumps({k: record[k] for k in ("passed", "cases", "tokens_identical")}))
    assert record["passed"] and record["tokens_identical"] and record["cases"] == 3
    assert set(built.manifest.entry_points) == {"decode", "encode"}
    assert built.manifest.generation["source"]["input"] in ("input_ids", "input_features")
    for row in record["outputs"]:
        assert row["cache_consistency"]["passed"], row["cache_consistency"]


def test_generates_like_hugging_face_on_a_new_source(bart_onnx):
    """A source text the validation never used: the artifact's greedy tokens are Hugging
    Face generate's, and another source changes them (the cross cache is read)."""
    _, program, folder = bart_onnx
    import transformers
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    tokens = {}
    for text in ("hello device, the fox", "a notebook"):
        got = program.generate(None, 20, source=text, stop_at_eos=False)
        ids = program.generator.tokenizer.encode(text)
        reference = hf_greedy(model, [model.config.decoder_start_token_id], 20,
                              {"input_ids": torch.tensor([ids])})
        print(text, got.tokens, reference)
        assert got.tokens == reference
        tokens[text] = got.tokens
    assert len(set(map(tuple, tokens.values()))) == 2


def test_whisper_generates_from_features_on_both_clis(whisper_onnx, cli, tmp_path):
    _, program = whisper_onnx
    features = torch.randn(16, 48, generator=torch.Generator().manual_seed(7))
    import numpy
    numpy.save(tmp_path / "features.npy", features.numpy())
    expected = program.generate(None, 6, source=features, stop_at_eos=False).tokens
    artifact = str(program.source)
    done = cli("generate", artifact, "--source-features", str(tmp_path / "features.npy"),
               "-n", "6", "--ignore-eos", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tokens"] == expected
    runtime_cli = subprocess.run(
        [sys.executable, "-m", "runtime", "generate", artifact, "--source-features",
         str(tmp_path / "features.npy"), "--max-new-tokens", "6", "--ignore-eos", "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert runtime_cli.returncode == 0, runtime_cli.stderr
    assert json.loads(runtime_cli.stdout)["tokens"] == expected


@pytest.mark.parametrize("args,said", [
    ((), "needs a source"),
    (("--source-ids", "1,2"), "input features of shape"),
    (("--source-features", "missing.npy"), "no such file"),
    (("--source", "x", "--source-ids", "1"), "give the source once"),
])
def test_whisper_bad_sources_are_exit_2(whisper_onnx, cli, args, said):
    done = cli("generate", str(whisper_onnx[1].source), *args, "-n", "2")
    print(done.stderr)
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr


def test_a_text_source_too_long_or_outside_the_vocabulary_is_exit_2(bart_onnx, cli):
    artifact = str(bart_onnx[1].source)
    bound = bart_onnx[0].manifest.generation["source"]["bound"]
    for ids, said in ((",".join(["5"] * (bound + 1)), "the encoder takes 1"),
                      ("5,9999", "outside the vocabulary")):
        done = cli("generate", artifact, "--source-ids", ids, "-n", "2")
        print(done.stderr)
        assert done.returncode == 2 and said in done.stderr


@pytest.mark.parametrize("spec,flags,said", [
    ("bart", ("--max-source", "500"), "over the encoder's 96 positions"),
    ("whisper", ("--max-source", "8"), "applies to text encoders"),
])
def test_bad_max_source_is_exit_2_before_any_capture(cli, tmp_path, spec, flags, said):
    out = tmp_path / "x.artifact"
    done = cli("build", f"{MODELS}:{spec}", "--task", "text-generation", "--target", "onnx",
               *flags, "--out", str(out))
    print(done.stderr)
    assert done.returncode == 2 and said in done.stderr and not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("spec,target,quantize", [
    ("t5", "onnx", None), ("whisper", "cpu", None), ("whisper", "cpu", "int4-weight"),
    ("whisper", "onnx", "int4-weight")])
def test_slow_builds_validate(spec, target, quantize, tmp_path):
    """T5 (its relative position bias over the cache) on onnx; Whisper through AOTInductor,
    in float and with int4 weights (its encoder hands the int4 GEMM transposed rows); the
    quantized builds on the labelled gate, bounds widened for random weights."""
    gate = {} if quantize is None else {"quantize": quantize, "min_top1": 0.8, "max_kl": 0.1}
    built = exporter.build(f"{MODELS}:{spec}", task="text-generation", target=target,
                           max_context=32, prefill_chunk=16, **gate,
                           out=tmp_path / f"{spec}-{target}.artifact")
    record = built.manifest.validation
    print(spec, target, quantize, record["passed"], record["tokens_identical"],
          record["top1_agreement"], record["mean_kl"])
    assert record["passed"] and (quantize is not None or record["tokens_identical"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_whisper_on_cuda_replays_decode_as_a_graph(dtype, tmp_path):
    """The cross cache lives in fixed buffers, so the decode step is one CUDA graph as a
    decoder-only model's: its tokens equal plain launches' and the validation passes."""
    out = tmp_path / f"whisper-cuda-{dtype}.artifact"
    built = exporter.build(f"{MODELS}:whisper", task="text-generation", target="cuda",
                           dtype=dtype, max_context=48, out=out)
    record = built.manifest.validation
    print(dtype, record["passed"], record["top1_agreement"], record["mean_kl"])
    assert record["passed"]
    features = torch.randn(16, 48, generator=torch.Generator().manual_seed(5))
    graphs, plain = runtime.load(out), runtime.load(out, cuda_graphs=False)
    assert graphs.generator._graph is not None
    tokens = [p.generate(None, 24, source=features, stop_at_eos=False).tokens
              for p in (graphs, plain)]
    assert tokens[0] == tokens[1]


def test_an_encoder_decoder_checkpoint_without_task_says_to_generate(bart_onnx, cli, tmp_path):
    """Its config's default was a plain forward (feature-extraction), which cannot run
    without decoder inputs: now a clear exit 2 naming the task to give."""
    out = tmp_path / "plain.artifact"
    done = cli("build", f"hf:{bart_onnx[2]}", "--target", "onnx", "--out", str(out))
    print(done.stderr)
    assert done.returncode == 2 and "--task text-generation" in done.stderr
    assert not out.exists()
