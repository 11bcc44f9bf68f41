"""Encoder-decoders under --task text-generation (exporter/lm/seq2seq.py): the contract of
encode + prefill + decode per family in eager (Whisper, BART, Marian, T5), and built
artifacts end to end: validation against Hugging Face generate, generation on sources the
build never saw, the decode-on-prefill fallback, cuda, and the bad inputs (Whisper's own:
tests/exporter/model/test_whisper.py)."""

from __future__ import annotations

import pytest
import torch

import exporter
import runtime
from exporter.lm.seq2seq import (ExportableEncoder, ExportableSeq2SeqStep, example_source,
                                 probe_seq2seq_layout, source_of)
from exporter.lm.validate import hf_greedy
from runtime.generation.cache import KvCache
from runtime.generation.layout import takes_one_token
from tests.conftest import ROOT
from tests.models import tiny_seq2seq

pytest.importorskip("transformers")
MODELS = ROOT / "tests" / "models" / "tiny_seq2seq.py"


@pytest.mark.parametrize("attention", ["grouped", "sdpa"])
@pytest.mark.parametrize("family", tiny_seq2seq.FAMILIES)
def test_encode_prefill_decode_equal_the_models_forward(family, attention):
    """The cross cache from ``encode`` (a short source in a longer buffer, the rest masked),
    a prefill of 5 decoder tokens and a decode step each give Hugging Face's logits, with
    our grouped attention (cpu, onnx) and with cuda's one SDPA call (T5, whose position
    bias that call does not take, through the model's own, its bias corrected)."""
    model = tiny_seq2seq.model(family)
    source = source_of(model, None)
    layout = probe_seq2seq_layout(model, source, 32, torch.float32)
    encoder = ExportableEncoder(model, layout, source).eval()
    step = ExportableSeq2SeqStep(model, layout, source, attention).eval()
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
    torch.testing.assert_close(prefill, reference[:, :5], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(decode[0, -1], reference[0, 5], rtol=1e-5, atol=1e-5)


def test_every_config_copy_attends_through_the_step_and_gets_its_own_back():
    """T5's encoder and decoder stacks hold copies of its config. transformers 5.17 set an
    attention implementation on the outer config only, so T5's layers kept SDPA, without
    the step's position-bias correction (the cuda builds on the GPU machine, which has
    5.17, failed the exact gate). Each copy is switched, and each gets its own back."""
    from exporter.lm.attention import ATTENTION_NAME, attending_in_place
    model = tiny_seq2seq.t5()
    model.decoder.config._attn_implementation = "eager"  # as if set apart from the outer
    owners = [model, model.encoder, model.decoder]
    before = [m.config._attn_implementation for m in owners]
    assert len({id(m.config) for m in owners}) == 3
    with attending_in_place(model, [], torch.tensor(0)):
        during = [m.config._attn_implementation for m in owners]
    after = [m.config._attn_implementation for m in owners]
    assert during == [ATTENTION_NAME] * 3
    assert after == before


def test_the_reference_generates_for_a_decoder_deeper_than_the_encoder():
    """transformers' generate sizes its cache by the config's layer count, which T5's
    num_decoder_layers passes: it raised IndexError, and the build's validation with it
    (exit 4). The reference's cache grows by the layers that write; its tokens are a
    full forward's greedy ones."""
    import transformers as tf
    torch.manual_seed(0)
    config = tf.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                         num_decoder_layers=3, num_heads=4, decoder_start_token_id=0,
                         pad_token_id=0, eos_token_id=1, relative_attention_num_buckets=8)
    model = tf.T5ForConditionalGeneration(config).eval()
    for param in model.parameters():
        torch.nn.init.normal_(param, std=0.5)
    source = {"input_ids": torch.tensor([[5, 6, 7, 1]])}
    tokens = hf_greedy(model, [0], 6, source)
    sequence = [0]
    with torch.no_grad():
        for _ in range(6):
            logits = model(**source, decoder_input_ids=torch.tensor([sequence]),
                           use_cache=False).logits
            sequence.append(int(logits[0, -1].argmax()))
    # exporter bench's static-cache baseline too: a static cache of the decoder's depth
    from transformers import GenerationConfig

    from exporter.lm.validate import hf_generate
    static = GenerationConfig(max_new_tokens=6, min_new_tokens=6, do_sample=False,
                              pad_token_id=0, cache_implementation="static")
    model.generation_config = GenerationConfig()
    runs = [hf_generate(model, torch.tensor([[0]]), static, source)[0, 1:].tolist()
            for _ in range(2)]  # the config serves run after run, as the bench's does
    assert tokens == sequence[1:] == runs[0] == runs[1]
    assert static.cache_implementation == "static"


@pytest.mark.parametrize("fixture", ["bart_onnx", "whisper_onnx"])
def test_validation_generates_like_hugging_face(fixture, request):
    built = request.getfixturevalue(fixture)[0]
    record = built.manifest.validation
    assert record["passed"] and record["tokens_identical"] and record["cases"] == 4
    last = record["outputs"][-1]  # the last generates up to the context's last position
    assert last["prompt_tokens"] + last["new_tokens"] == built.manifest.generation.max_context
    # onnx: prefill decodes too, unless the capture could not keep one token
    one_program = built.manifest.source["decode_on_prefill"]
    assert set(built.manifest.entry_points) == ({"encode"} if one_program else {"encode", "decode"})
    assert built.manifest.generation.source["input"] in ("input_ids", "input_features")
    for row in record["outputs"]:
        assert row["cache_consistency"]["passed"], row["cache_consistency"]


def test_generates_like_hugging_face_on_a_new_source(bart_onnx):
    """A source text the validation never used: the artifact's greedy tokens are Hugging
    Face generate's, and another source changes them (the cross cache is read). A
    one-token source too: transformers' SDPA tests ``q_length > 1``, which had pinned the
    encode program to 2 tokens or more."""
    _, program, folder = bart_onnx
    import transformers
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    program = runtime.load(program.source)  # the raw greedy choice: BART's forced eos aside
    program.generator.config["forced_eos_token_id"] = None
    tokens = {}
    for text in ("hello device, the fox", "a notebook", [5, 9], [7]):  # one token too
        got = program.generate(None, 20, source=text, stop_at_eos=False)
        ids = program.generator.tokenizer.encode(text) if isinstance(text, str) else text
        reference = hf_greedy(model, [model.config.decoder_start_token_id], 20,
                              {"input_ids": torch.tensor([ids])})
        assert got.tokens == reference
        tokens[str(text)] = got.tokens
    assert len(set(map(tuple, tokens.values()))) == 4
    assert program.manifest.generation.source["shortest"] == 1


def test_a_given_decoder_prompt_starts_as_transformers_generate_starts_it(bart_onnx):
    """transformers' generate puts the decoder start token before decoder_input_ids that
    lack it (Whisper's excepted); a text prompt is the text's own tokens, not the
    tokenizer's bos ... eos template. The artifact's tokens are then generate's."""
    _, program, folder = bart_onnx
    import transformers
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    program = runtime.load(program.source)  # its own config: BART's forced eos set aside
    program.generator.config["forced_eos_token_id"] = None
    source = program.generator.tokenizer.encode("hello device, the fox")
    start = model.config.decoder_start_token_id
    words = program.generator.tokenizer.encode("the quick", special=False)
    for prompt, ids in (([5, 6], [5, 6]), ([start, 5, 6], [5, 6]), ("the quick", words)):
        got = program.generate(prompt, 8, source=source, stop_at_eos=False)
        with torch.no_grad():
            want = model.generate(input_ids=torch.tensor([source]),
                                  decoder_input_ids=torch.tensor([ids]), max_new_tokens=8,
                                  min_new_tokens=8, do_sample=False, num_beams=1,
                                  forced_eos_token_id=None)[0].tolist()
        assert got.prompt_tokens == [start, *ids] and got.prompt_tokens + got.tokens == want


def test_forced_first_and_last_tokens_are_transformers_generates(bart_onnx):
    """The generation config's forced_eos_token_id (BART's: eos as the last of
    max_new_tokens) and forced_bos_token_id (mBART-50's and M2M100's target language, first)
    apply as transformers' generate applies them."""
    _, program, folder = bart_onnx
    import transformers
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    generator = runtime.load(program.source).generator  # its own copy of the config
    source = generator.tokenizer.encode("hello device, the fox")
    eos = model.generation_config.forced_eos_token_id
    for bos in (None, 7):
        generator.config["forced_bos_token_id"] = bos
        got = generator.generate(None, 6, source=source)
        with torch.no_grad():
            want = model.generate(input_ids=torch.tensor([source]), max_new_tokens=6,
                                  min_new_tokens=0, do_sample=False, num_beams=1,
                                  forced_bos_token_id=bos)[0, 1:].tolist()
        assert got.tokens + ([eos] if got.stop_reason == "eos" else []) == want
        assert bos is None or got.tokens[0] == bos
    assert eos is not None and got.stop_reason == "eos"  # forced as the 6th


def test_a_decode_step_that_cannot_be_captured_decodes_on_prefill():
    """MVP numbers its decoder positions arange(t, t + T) from two reads of the cache
    length: at a fixed T = 1 that size is unknown to torch.export. The cpu build then
    decodes on its prefill program (from one token, as onnx's always does) and says so
    (the build, validated, is in make test-slow)."""
    from exporter.lm.build import dry_run_generating
    from exporter.settings import BuildSettings
    settings = BuildSettings(target="cpu", task="text-generation", max_context=32)
    preps = dry_run_generating(f"{MODELS}:mvp", settings).preps
    warnings = preps["prefill"].warnings
    assert sorted(preps) == ["encode", "prefill"]
    assert takes_one_token(preps["prefill"].captured.signature)
    assert any("decode runs on the prefill program" in w and "modeling_mvp.py" in w
               for w in warnings)


@pytest.mark.slow
def test_a_model_decoding_on_prefill_builds_for_cpu_and_generates_like_hugging_face(tmp_path):
    built = exporter.build(f"{MODELS}:mvp", task="text-generation", target="cpu",
                           max_context=32, out=tmp_path / "mvp.artifact")
    record = built.manifest.validation
    assert record["passed"] and record["tokens_identical"]
    assert "decode" not in built.manifest.entry_points


def test_bad_sources_are_user_errors_naming_the_input(whisper_onnx, bart_onnx):
    """In process (the CLI's exit 2 for a UserInputError is the test above's): each bad
    source names what is wrong with it."""
    from runtime.errors import UserInputError
    from runtime.generation import parse_source
    from runtime.generation.audio import Waveform
    whisper, bart = whisper_onnx[1], bart_onnx[1]
    bound = bart.manifest.generation.source["bound"]
    cases = [
        (lambda: whisper.generate(None, 2, source=[1, 2]), "takes input features, not "
                                                             "token ids"),
        (lambda: whisper.generate(None, 2, source="hello"), "takes input features, not text"),
        (lambda: whisper.generate(None, 2, source=torch.zeros(3, 5)), "input features of shape"),
        (lambda: parse_source(None, None, "missing.npy"), "no such file"),
        (lambda: parse_source("x", "1", None), "give the source once"),
        (lambda: bart.generate(None, 2, source=[5] * (bound + 1)), "encoder takes 1 to"),
        (lambda: bart.generate(None, 2, source=[]), "the source has 0 token"),
        (lambda: bart.generate(None, 2, source=torch.zeros(16, 48)), "takes text or token ids, "
                                                                       "not input features"),
        (lambda: whisper.generate(None, 2, source=torch.full((16, 48), float("nan"))),
         "768 input feature value\\(s\\) are NaN"),
        (lambda: bart.generate(None, 2, source=[5, 9999]), "outside the vocabulary"),
        (lambda: bart.generate(None, 2, source=Waveform(torch.zeros(8).numpy(), 16000)),
         "takes no audio"),
    ]
    for call, said in cases:
        with pytest.raises(UserInputError, match=said):
            call()


def test_bad_max_source_is_exit_2_before_any_capture(cli_here, tmp_path):
    out = tmp_path / "x.artifact"
    done = cli_here("build", f"{MODELS}:bart", "--task", "text-generation", "--target", "onnx",
                    "--max-source", "500", "--out", str(out))
    assert done.returncode == 2 and "over the encoder's 96 positions" in done.stderr
    assert not out.exists()
    from exporter.errors import UserInputError
    with pytest.raises(UserInputError, match="applies to text encoders"):
        exporter.build(f"{MODELS}:whisper", task="text-generation", target="onnx",
                       max_source=8, out=out)
    # T5's relative positions set no limit; its attention over the source is N x N
    with pytest.raises(UserInputError, match="over 8192, the most this export takes"):
        exporter.build(f"{MODELS}:t5", task="text-generation", target="onnx",
                       max_source=100_000, out=out)
    assert not out.exists()


def test_a_source_vocabulary_of_its_own_is_the_sources_bound(tmp_path):
    """Marian checkpoints with two vocabularies (the source's larger here): source ids are
    checked against the encoder's table, not the decoder's logits (the build's own
    validation failed on a source id of 316 < 320)."""
    out = tmp_path / "marian.artifact"
    built = exporter.build(f"{MODELS}:marian_two_vocabs", task="text-generation",
                           target="onnx", max_context=24, max_source=12, out=out)
    assert built.manifest.validation["passed"]
    program = runtime.load(out)
    assert program.generator.vocab == tiny_seq2seq.VOCAB - 20
    program.generate(None, 2, source=[5, tiny_seq2seq.VOCAB - 5, 7])  # past the target's
    with pytest.raises(runtime.UserInputError, match=f"vocabulary of {tiny_seq2seq.VOCAB}"):
        program.generate(None, 2, source=[5, tiny_seq2seq.VOCAB + 1])


@pytest.mark.slow
@pytest.mark.parametrize("spec,target,quantize", [
    ("t5", "onnx", None), ("whisper", "cpu", None), ("whisper", "cpu", "int4-weight"),
    ("whisper", "onnx", "int4-weight")])
def test_slow_builds_validate(spec, target, quantize, tmp_path):
    """T5 (its relative position bias over the cache) on onnx; Whisper through AOTInductor,
    in float and with int4 weights (its encoder hands the int4 GEMM transposed rows); the
    quantized builds on the labelled gate, bounds widened for random weights (std 0.2: int4
    rounding moves their peaked logits)."""
    gate = {} if quantize is None else {"quantize": quantize, "min_top1": 0.5, "max_kl": 1.0}
    built = exporter.build(f"{MODELS}:{spec}", task="text-generation", target=target,
                           max_context=32, prefill_chunk=16, **gate,
                           out=tmp_path / f"{spec}-{target}.artifact")
    record = built.manifest.validation
    assert record["passed"] and (quantize is not None or record["tokens_identical"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("spec,dtype", [
    ("whisper", "fp32"), ("whisper", "fp16"), ("t5", "fp32")])
def test_on_cuda_decode_replays_as_a_graph(spec, dtype, tmp_path):
    """The cross cache lives in fixed buffers, so the decode step is one CUDA graph as a
    decoder-only model's: its tokens equal plain launches' and the validation passes (T5:
    the model's own attention, as cuda runs it, with its position bias corrected)."""
    out = tmp_path / f"{spec}-cuda-{dtype}.artifact"
    built = exporter.build(f"{MODELS}:{spec}", task="text-generation", target="cuda",
                           dtype=dtype, max_context=48, out=out)
    record = built.manifest.validation
    assert record["passed"]
    source = (torch.randn(16, 48, generator=torch.Generator().manual_seed(5))
              if spec == "whisper" else [5, 17, 9, 30, 11, 4])
    graphs, plain = runtime.load(out), runtime.load(out, cuda_graphs=False)
    assert graphs.generator._graph is not None
    tokens = [p.generate(None, 24, source=source, stop_at_eos=False).tokens
              for p in (graphs, plain)]
    assert tokens[0] == tokens[1]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_a_model_decoding_on_prefill_generates_like_hugging_face(tmp_path):
    """MVP's one-token step cannot be captured, so its cuda build has no fixed-shape decode
    entry: the generator runs the prefill program a token at a time, without a CUDA graph,
    and still gives Hugging Face's tokens."""
    out = tmp_path / "mvp-cuda.artifact"
    built = exporter.build(f"{MODELS}:mvp", task="text-generation", target="cuda",
                           max_context=32, out=out)
    record = built.manifest.validation
    assert record["passed"] and record["tokens_identical"]
    assert "decode" not in built.manifest.entry_points
    program = runtime.load(out)
    assert program.generator._graph is None
    assert len(program.generate(None, 12, source=[5, 17, 9, 30], stop_at_eos=False).tokens) == 12


def test_an_encoder_decoder_checkpoint_without_task_says_to_generate(bart_onnx, cli_here,
                                                                     tmp_path):
    """Its config's default was a plain forward (feature-extraction), which cannot run
    without decoder inputs: now a clear exit 2 naming the task to give."""
    out = tmp_path / "plain.artifact"
    done = cli_here("build", f"hf:{bart_onnx[2]}", "--target", "onnx", "--out", str(out))
    assert done.returncode == 2 and "--task text-generation" in done.stderr
    assert not out.exists()
