"""Generating with an artifact (the session's tiny Gemma-3-style ``onnx_lm``): text, streams,
stop strings and seeded sampling from Python, both CLIs, the prompt's forms, the carried
generation config (its defaults, and what the generator says it does not apply), and the
bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import runtime
from runtime.generation.sampling import Sampling
from tests.conftest import ROOT
from tests.models import tiny_lm

pytest.importorskip("transformers")


def test_generate_text_stream_stop_and_sampling(onnx_lm):
    _, program = onnx_lm
    pieces = []
    result = program.generate("hello world", 12, stop_at_eos=False,
                              stream=lambda token, piece: pieces.append(piece))
    assert isinstance(result.text, str) and len(result.tokens) == 12
    assert "".join(pieces) == result.text and result.prompt_tokens[0] == 1  # bos added
    stop = result.text[len(result.text) // 2:][:3]
    stopped = program.generate("hello world", 12, stop=[stop], stop_at_eos=False)
    assert stopped.stop_reason == "stop_string" and stop not in stopped.text
    seeded = [program.generate("hello", 8, sampling=Sampling(0.9, 40, 0.95, seed=7),
                               stop_at_eos=False).tokens for _ in range(2)]
    assert seeded[0] == seeded[1]
    full = program.generate([1] * 60, 20, stop_at_eos=False)
    # 60 + 5 = 65: the last token is never fed back, so it needs no slot of the 64
    assert full.stop_reason == "context_full" and len(full.tokens) == 5


class _Pieces:
    """A tokenizer whose ids are pieces of text (decode joins them)."""
    def __init__(self, *pieces: str) -> None:
        self.pieces = pieces

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids)


@pytest.mark.parametrize("stops, text, reason", [
    (["d e"], "abc ", "stop"),  # spans two tokens: held back, then cut before it
    (["xyz"], "abc d ef", None),  # never found: what was held back comes at the end
    (["b", "e"], "a", "stop"),  # the first stop string in the text wins
    ([], "abc d ef", None),
])
def test_stop_strings_cut_the_text_and_the_stream_never_runs_past_it(stops, text, reason):
    """The streamed pieces join to the result's text, even when a stop string begins in
    one token and ends in the next (an outside check saw the stream print past it)."""
    from runtime.generation.stopping import StoppingText
    tokenizer = _Pieces("ab", "c", " d", " e", "f")
    calls = []
    stopping = StoppingText(tokenizer, tuple(stops), lambda t, piece: calls.append((t, piece)))
    stopped = None
    for n in range(1, 6):
        if stopping.add(list(range(n))):
            stopped = n
            break
    final = stopping.finish()
    assert final == text and "".join(piece for _, piece in calls) == text
    assert (stopped is not None) == (reason == "stop")
    assert all(token is not None for token, _ in calls[:-1])


def test_stop_and_sampling_mistakes_are_user_errors(onnx_lm):
    _, program = onnx_lm
    for call, said in (
            (lambda: program.generate([1, 5], 3, stop=[""]), "stop string is empty"),
            (lambda: program.generate([1, 5], 3, stop="ab"), "a list of strings"),
            (lambda: program.generate([1, 5], 2.5), "max_new_tokens is 2.5"),
            (lambda: Sampling(1.0, top_k=2.5), "top_k 2.5"),
            (lambda: Sampling(1.0, seed=2**70), "seed"),
            (lambda: Sampling(float("nan")), "temperature nan")):
        with pytest.raises(runtime.UserInputError, match=said):
            call()
    # a temperature far below 1 is greedy in effect, not NaN probabilities
    tiny = program.generate([1, 5], 4, sampling=Sampling(1e-45, seed=1), stop_at_eos=False)
    assert tiny.tokens == program.generate([1, 5], 4, stop_at_eos=False).tokens


def test_generation_config_settings_are_applied_or_said_once(onnx_lm, caplog):
    """The carried generation config's max_new_tokens is the default length, as in
    transformers' generate; a setting the generator does not apply (repetition_penalty,
    ...) and a config that samples are each said once, not dropped in silence."""
    _, program = onnx_lm
    generator = runtime.load(program.source).generator  # its own copy of the config
    generator.config.update(repetition_penalty=1.5, no_repeat_ngram_size=2, do_sample=True,
                            temperature=0.6, top_p=0.9, max_new_tokens=5)
    with caplog.at_level("WARNING", logger="runtime.generation.generator"):
        first = generator.generate([1, 5, 9], stop_at_eos=False)
        again = generator.generate([1, 5, 9], stop_at_eos=False)
    notes = [record.getMessage() for record in caplog.records]
    assert len(first.tokens) == 5 and first.tokens == again.tokens  # greedy unless asked
    assert len(notes) == 2 and "repetition_penalty=1.5, no_repeat_ngram_size=2" in notes[0]
    assert "--temperature 0.6 --top-p 0.9" in notes[1]


def test_the_build_says_which_generation_config_settings_the_artifact_leaves_out():
    """Said when generating (above) and already at build, where an outside check found
    them unsaid: a reader of the build's warnings knows before deploying."""
    from exporter.lm.source import load_language_model
    from exporter.model.hf_spec import HfOptions
    model = tiny_lm.model("llama")
    model.generation_config.update(repetition_penalty=1.3, do_sample=True)
    notes = load_language_model(model, HfOptions()).notes
    assert any("repetition_penalty=1.3" in n and "does not apply" in n for n in notes)
    assert any("samples (do_sample)" in n for n in notes)
    assert not any("generation config" in n for n in load_language_model(
        tiny_lm.model("llama"), HfOptions()).notes)


def test_prompt_ids_as_a_tokenizer_gives_them_and_bad_forms(onnx_lm):
    import numpy as np
    _, program = onnx_lm
    want = program.generate([1, 5, 9], 3, stop_at_eos=False).tokens
    for ids in (torch.tensor([[1, 5, 9]]), np.array([1, 5, 9]), (1, 5, 9)):
        assert program.generate(ids, 3, stop_at_eos=False).tokens == want
    for bad, said in (([1.5, 2], "not all integers"), (torch.ones(2, 3, dtype=torch.long),
                      "one sequence is generated at a time"), (5, "the prompt is a int")):
        with pytest.raises(runtime.UserInputError, match=said):
            program.generate(bad, 2)


def test_cli_generate(onnx_lm, cli_here):
    """exporter generate through its in-process twin (the CLI's start-up is
    tests/exporter/cli/test_startup.py's); the device runtime's CLI in a process of its
    own, as it runs without the exporter."""
    built, program = onnx_lm
    expected = program.generate([1, 5, 9], 6, stop_at_eos=False).tokens
    done = cli_here("generate", str(built.artifact), "--prompt-ids", "1,5,9", "-n", "6",
               "--ignore-eos", "--json")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["tokens"] == expected
    from tests.exporter.cli.test_cli_style import DOCUMENTED
    assert DOCUMENTED["generate"] <= set(printed), "generate --json lacks documented keys"
    device = subprocess.run([sys.executable, "-m", "runtime", "generate", str(built.artifact),
                             "--prompt-ids", "1,5,9", "--max-new-tokens", "6", "--ignore-eos",
                             "--json"], capture_output=True, text=True, cwd=ROOT)
    assert device.returncode == 0, device.stderr
    assert json.loads(device.stdout)["tokens"] == expected


@pytest.mark.parametrize("args, said", [
    (["--prompt-ids", "1,999"], "outside the vocabulary of 384"),
    (["--prompt-ids", ",".join(["5"] * 65)], "do not fit the artifact's context of 64"),
    (["--prompt", "hi", "--prompt-ids", "1"], "one of them"),
    (["--prompt-ids", "1,x"], "is not a list of integers"),
    (["--prompt-ids", "1", "--top-p", "0"], "top_p"),
])
def test_generate_bad_input_is_exit_2(onnx_lm, cli_here, args, said):
    built, _ = onnx_lm
    done = cli_here("generate", str(built.artifact), *args)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr


def test_generate_preloads_the_custom_ops_an_artifact_calls(cli_here):
    """The runtime's hint for an unregistered custom op says --preload: both CLIs take it
    (Mixtral's CPU fallback calls transformers::grouped_mm_fallback)."""
    done = cli_here("generate", "--help")
    assert done.returncode == 0 and "--preload" in done.stdout


@pytest.mark.parametrize("source", ["edge_no_such_module", "no_such_ops.py"])
def test_a_preload_that_cannot_be_imported_is_exit_2(onnx_lm, cli_here, source):
    done = cli_here("generate", str(onnx_lm[0].artifact), "--prompt-ids", "1", "-n", "1",
                    "--preload", source)
    assert done.returncode == 2 and f"--preload {source}" in done.stderr
    assert "Traceback" not in done.stderr


def test_generate_refuses_a_plain_artifact(cli_here, onnx_mlp):
    done = cli_here("generate", str(onnx_mlp), "--prompt-ids", "1")
    assert done.returncode == 2 and "--task text-generation" in done.stderr


def test_incremental_text_is_the_whole_decode(tmp_path):
    """The streamed text (a short window decoded per token, runtime/generation/
    tokenizer.py) is what decoding all the tokens at once gives, on ids that split
    multi-byte characters, and costs the same per token at any length."""
    import random

    from runtime.generation.tokenizer import IncrementalText, Tokenizer
    folder = tiny_lm.checkpoint(tmp_path / "tok")
    tokenizer = Tokenizer((folder / "tokenizer.json").read_text(), where="test")
    rng = random.Random(0)
    for ids in (tokenizer.encode("hello device, ünïcödé 🙂 " * 4),
                [rng.randrange(tiny_lm.VOCAB) for _ in range(400)]):
        growing = IncrementalText(tokenizer)
        pieces = [growing.extend(ids[:n + 1]) for n in range(len(ids))]
        whole = tokenizer.decode(ids)
        assert "".join(pieces) == growing.text
        assert whole.startswith(growing.text) and len(whole) - len(growing.text) <= 1


def test_validate_rechecks_a_generating_artifact_by_its_gate(onnx_lm, onnx_mlp, cli_here):
    """`exporter validate` on a generating artifact generates against transformers again,
    with the model its manifest names when --model is left out (as `exporter bench`)."""
    built, _ = onnx_lm
    done = cli_here("validate", str(built.artifact), "--json")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)["validation"]
    assert record["passed"] and record["kind"] == "generation" and record["tokens_identical"]
    plain = cli_here("validate", str(onnx_mlp))  # a plain artifact: its own spec, zoo:mlp
    assert plain.returncode == 0 and "PASSED" in plain.stdout, plain.stderr


def test_validate_against_other_weights_is_exit_1_with_the_first_divergence(onnx_lm, tmp_path,
                                                                             cli_here):
    """Logits (and so, on most models, tokens) that differ: exit 1 and what failed where
    (it was exit 4, a KeyError in the plain records' failure lines)."""
    import shutil

    from safetensors.torch import load_file, save_file
    built, _ = onnx_lm
    other = shutil.copytree(built.artifact.parent / "tiny-gemma3", tmp_path / "other")
    weights = load_file(other / "model.safetensors")
    torch.manual_seed(0)
    save_file({k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v
               for k, v in weights.items()}, other / "model.safetensors")
    done = cli_here("validate", str(built.artifact), "--model", f"hf:{other}")
    assert done.returncode == 1 and "FAILED" in done.stdout, done.stderr
    assert "case0 logits: max abs error" in done.stdout and "internal error" not in done.stderr
    # a model of another vocabulary: its prompts indexed past a table (exit 4, IndexError)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "vocab_size": 300}))
    save_file({k: v[:300] if v.shape[:1] == (384,) else v
               for k, v in load_file(other / "model.safetensors").items()},
              other / "model.safetensors")
    done = cli_here("validate", str(built.artifact), "--model", f"hf:{other}")
    assert done.returncode == 2 and "vocabulary has 384 tokens and the model's 300" in done.stderr


def test_bench_times_a_generating_artifact_as_asked(onnx_lm, cli_here):
    """`exporter bench` on a generating artifact: the artifact and transformers in turns,
    with the runs and untimed warm-ups asked for (--warmup was ignored); --runs 0 is exit 2."""
    built, _ = onnx_lm
    done = cli_here("bench", str(built.artifact), "--baseline", "eager", "--prompt-tokens", "8",
                    "--new-tokens", "8", "--runs", "2", "--warmup", "0", "--json")
    assert done.returncode == 0, done.stderr
    timed = json.loads(done.stdout)
    assert (timed["runs"], timed["warmup"]) == (2, 0)
    assert set(timed["engines"]) == {"artifact", "hf-eager"}
    assert all(row["decode_tokens_per_s"] > 0 for row in timed["engines"].values())
    refused = cli_here("bench", str(built.artifact), "--runs", "0")
    assert refused.returncode == 2 and "--runs 1 or more" in refused.stderr


def test_bench_peak_memory_is_the_artifacts_own(onnx_lm):
    """The peak resident memory of the child that generates is its own: the wait's
    ru_maxrss carried the parent's size into it (the figure moved with the baselines the
    bench had loaded), so beside a parent holding 1 GiB more it stays well below it."""
    import psutil

    from exporter.lm.bench import _child_peak_rss
    built, _ = onnx_lm
    ballast = torch.ones(2**28)  # 1 GiB resident in this, the parent, process
    parent = psutil.Process().memory_info().rss / 2**20
    child = _child_peak_rss(built.artifact, [5, 9, 11], 4, None)
    del ballast  # held while the child ran
    # ru_maxrss gave the child at least the parent's size; its own is a few hundred MB
    assert child is not None and 50 < child < min(parent - 1024, 900)


def test_bench_lengths_fit_a_short_context_and_a_plain_artifact_takes_none(onnx_mlp, cli_here):
    """128 + 128 by default, or what a shorter context holds (it was exit 2 on any
    artifact under 255 tokens), counted as ``generate`` counts (57 + 8 fit 64 slots: the
    last new token is not fed back); --new-tokens on a plain artifact is exit 2."""
    from exporter.lm.bench import fitted_lengths
    assert fitted_lengths(None, None, 1024) == (128, 128)
    assert fitted_lengths(None, None, 64) == (32, 33) and fitted_lengths(None, 8, 64) == (57, 8)
    assert fitted_lengths(57, 8, 64) == (57, 8) and fitted_lengths(60, None, 64) == (60, 5)
    with pytest.raises(runtime.UserInputError, match="do not fit the artifact's context of 64"):
        fitted_lengths(58, 8, 64)
    plain = cli_here("bench", str(onnx_mlp), "--new-tokens", "8")
    assert plain.returncode == 2 and "apply to generating artifacts" in plain.stderr


def test_ids_generate_without_the_tokenizers_package(onnx_lm, monkeypatch, caplog):
    """A device without `tokenizers` (an optional extra): generating from ids failed after
    the tokens were made, decoding them to text. Ids now come out as ids, said once; text
    in (or stop strings) is a CompatibilityError naming the package."""
    from runtime.errors import CompatibilityError
    built, _ = onnx_lm
    program = runtime.load(built.artifact)  # its own: no tokenizer loaded yet
    monkeypatch.setattr("runtime.generation.tokenizer.tokenizers_installed", lambda: False)
    streamed = []
    result = program.generate([1, 5, 9], 4, stop_at_eos=False,
                              stream=lambda token, piece: streamed.append((token, piece)))
    assert len(result.tokens) == 4 and result.text is None
    assert streamed == [(t, None) for t in result.tokens]
    assert "'tokenizers' package is not installed" in caplog.text
    for call in (lambda: program.generate("hello", 2), lambda: program.generate([1], 2, stop=["x"])):
        with pytest.raises(CompatibilityError, match="needs the 'tokenizers' package"):
            call()
