"""Attacks on generation from outside: threads sharing one loaded program, a tokenizer
that does not parse or whose regex backtracks without end, a generation section that
contradicts the programs, and Python values of the wrong type. Each is refused with a
typed error (exit 2, one paragraph, one JSON object under --json) or, for threads, gives
exactly the single-threaded tokens."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

import runtime
from runtime.format.archive import ArtifactReader
from exporter.ship.archive_writer import write_artifact
from runtime.errors import ArtifactError, UserInputError
from runtime.generation.sampling import Sampling
from tests.conftest import ROOT

pytest.importorskip("transformers")
PROMPTS = [[1, 5 + i, 9, 20 + i] for i in range(8)]


def _rewrite(src, dst, change=None, files_change=None):
    with ArtifactReader.open(src) as reader:
        manifest = json.loads(json.dumps(reader.manifest))
        files = {name: reader.read_bytes(name) for name in reader.names()}
    if change:
        change(manifest)
    if files_change:
        files_change(manifest, files)
    write_artifact(dst, manifest, files)
    return dst


def _in_threads(count, work):
    results = [None] * count
    errors = []

    def run(index):
        try:
            results[index] = work(index)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's assert
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return results


def test_threads_sharing_one_program_get_single_thread_tokens(onnx_lm):
    """Eight threads on one loaded program got other tokens than alone (one KV cache, no
    lock): greedy, seeded sampling and streams now give each call its own tokens."""
    built, _ = onnx_lm
    program = runtime.load(built.artifact)

    def alone(i):
        greedy = program.generate(PROMPTS[i], 16, stop_at_eos=False).tokens
        sampled = program.generate(PROMPTS[i], 16, stop_at_eos=False,
                                   sampling=Sampling(0.9, seed=i)).tokens
        return greedy, sampled
    expected = [alone(i) for i in range(8)]

    def shared(i):
        pieces = []
        streamed = program.generate(PROMPTS[i], 16, stop_at_eos=False,
                                    stream=lambda token, piece: pieces.append(piece))
        assert "".join(pieces) == streamed.text
        return [(alone(i), streamed.tokens) for _ in range(3)]
    for i, runs in enumerate(_in_threads(8, shared)):
        for got, streamed in runs:
            assert got == expected[i] and streamed == expected[i][0]
    forced = program.generator.forced_logits(PROMPTS[0], expected[0][0][:4])
    for rows in _in_threads(4, lambda i: program.generator.forced_logits(
            PROMPTS[0], expected[0][0][:4])):
        assert rows.equal(forced)


def test_a_stream_callback_that_generates_again_is_refused_not_deadlocked(onnx_lm):
    _, program = onnx_lm

    def again(token, piece):
        program.generate([1, 5], 2)
    with pytest.raises(UserInputError, match="inside its own generation"):
        program.generate([1, 5, 9], 3, stop_at_eos=False, stream=again)
    assert len(program.generate([1, 5, 9], 3, stop_at_eos=False).tokens) == 3


def test_token_ids_that_are_bools_and_options_of_the_wrong_type_are_input_errors(onnx_lm):
    """generate([True, 2]) took True as token 1, and sampling={} raised AttributeError."""
    _, program = onnx_lm
    greedy = program.generate([1, 5, 9], 4, stop_at_eos=False).tokens
    assert program.generate([1, 5, 9], 4, stop_at_eos=False, sampling={}).tokens == greedy
    seeded = program.generate([1, 5], 6, stop_at_eos=False, sampling=Sampling(0.9, seed=3))
    assert program.generate([1, 5], 6, stop_at_eos=False,
                            sampling={"temperature": 0.9, "seed": 3}).tokens == seeded.tokens
    for call, said in (
            (lambda: program.generate([True, 2], 2), "not all integers"),
            (lambda: program.generate([1, 2.0], 2), "not all integers"),
            (lambda: program.generate([1, 2], True), "max_new_tokens is True"),
            (lambda: program.generate([1, 2], 2, sampling={"temp": 1}), "unknown key"),
            (lambda: program.generate([1, 2], 2, sampling="greedy"), "sampling is a str"),
            (lambda: program.generate([1, 2], 2, sampling={"temperature": -1}),
             "temperature -1"),
            (lambda: program.generate([1, 2], 2, stop=5), "stop is a int"),
            (lambda: program.generate([1, 2], 2, stop_at_eos="no"), "stop_at_eos is a str"),
            (lambda: program.generate([1, 2], 2, stream=5), "stream is a int"),
            (lambda: program.generate([1, 2], 2, language=5), "language is a int"),
            (lambda: program.generate([1, 2], 2, temprature=1), "no option temprature"),
            (lambda: program.generator.forced_logits([1, True], [2]), "not all integers")):
        with pytest.raises(UserInputError, match=said):
            call()


def _clean(done, code, *needles, as_json=False):
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "panicked" not in done.stderr, done.stderr
    assert sum(line.startswith("error:") for line in done.stderr.splitlines()) <= 1
    for needle in needles:
        assert needle in done.stderr, (needle, done.stderr)
    if as_json:
        printed = json.loads(done.stdout)  # one object, errors included
        assert printed["json_version"] == 1
        return printed
    return None


def _device_cli(*args):
    return subprocess.run([sys.executable, "-m", "runtime", "generate", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def _tokenizer_entry(manifest):
    return manifest["generation"]["tokenizer"]


def test_a_tokenizer_that_does_not_parse_generates_by_ids_and_refuses_text(onnx_lm, tmp_path,
                                                                           cli_here):
    """A tokenizer.json that does not parse: exit 4 even with --prompt-ids, and a raw
    traceback (exit 1) on the device's CLI. Ids now generate (the tokenizer said
    unusable); text is exit 2 with one paragraph, on both CLIs, --json one object (the
    exporter's in process, the device's in a process of its own)."""
    built, program = onnx_lm
    bad = _rewrite(built.artifact, tmp_path / "bad-tokenizer.artifact", files_change=lambda m, f:
                   f.update({_tokenizer_entry(m): b'{"model": {"type": "nothing"'}))
    expected = program.generate([1, 5, 9], 4, stop_at_eos=False).tokens
    for run in (lambda *a: cli_here("generate", *a), _device_cli):
        done = run(str(bad), "--prompt-ids", "1,5,9", "-n", "4", "--ignore-eos", "--json")
        assert _clean(done, 0, "tokenizer", as_json=True)["tokens"] == expected
        streamed = run(str(bad), "--prompt-ids", "1,5,9", "-n", "4", "--ignore-eos")
        assert streamed.returncode == 0 and str(expected[0]) in streamed.stdout
        refused = run(str(bad), "--prompt", "hello", "--json")
        error = _clean(refused, 2, "tokenizer.json) cannot be read", as_json=True)["error"]
        assert error["exit_code"] == 2 and error["type"] == "ArtifactError"


def test_a_tokenizer_whose_regex_backtracks_is_exit_2_with_one_json_object(onnx_lm, tmp_path,
                                                                          cli_here):
    """A pre-tokenizer regex that backtracks past Oniguruma's limit: a Rust panic
    (pyo3's PanicException, a BaseException) and a traceback, exit 1, no JSON. Now exit 2
    and one JSON object (the exporter's CLI in process, the device's in its own)."""
    built, _ = onnx_lm

    def catastrophic(manifest, files):
        raw = json.loads(files[_tokenizer_entry(manifest)])
        raw["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(a|aa)+$"},
                                "behavior": "Isolated", "invert": False}
        files[_tokenizer_entry(manifest)] = json.dumps(raw).encode()
    bad = _rewrite(built.artifact, tmp_path / "backtracking.artifact", files_change=catastrophic)
    prompt = "a" * 60 + "b"
    for run in (lambda *a: cli_here("generate", *a), _device_cli):
        done = run(str(bad), "--prompt", prompt, "-n", "2", "--json")
        error = _clean(done, 2, "failed on the text", as_json=True)["error"]
        assert "retry-limit" in error["message"]
    with pytest.raises(ArtifactError, match="failed on the text"):
        runtime.load(bad).generate(prompt, 2)
    with pytest.raises(UserInputError, match="characters, more than"):
        runtime.load(built.artifact).generate("hello " * 100_000, 2)


def _generation(change):
    return lambda manifest: change(manifest["generation"])


def _cache_of(size):
    def change(generation):
        for layer in generation["cache"]["layers"]:
            layer["slots"] = size
    return change


@pytest.mark.parametrize("change, needle", [
    (lambda g: g.update(prefill_chunk=0), "prefill_chunk must be a positive integer"),
    (lambda g: g.update(prefill_chunk=1), "prefill_chunk is 1"),
    (lambda g: g.update(prefill_chunk=10**6), "prefill_chunk is 1000000"),
    (lambda g: g.update(max_context=10**6), "max_context is 1000000"),
    (_cache_of(2**28), "cache buffer past_k_0 would be"),
    (lambda g: g.update(eos_token_ids=[2, 10**9]), "eos_token_ids holds [1000000000]"),
    (lambda g: g.update(eos_token_ids=[True]), "eos_token_ids must be a list of integers"),
    (lambda g: g["cache"].update(dtype="relu"), "not a torch dtype"),
    (lambda g: g.update(generation_config={"forced_bos_token_id": 99999}),
     "forced_bos_token_id holds [99999]"),
    (lambda g: g.update(generation_config={"suppress_tokens": ["x"]}), "suppress_tokens"),
], ids=["chunk-0", "chunk-1", "chunk-past-prefill", "context-past-cache", "cache-128gb",
        "eos-past-vocab", "eos-bool", "dtype-not-dtype", "forced-past-vocab",
        "suppress-not-ids"])
def test_generation_settings_that_contradict_the_programs_are_refused_at_load(
        onnx_lm, tmp_path, cli_here, change, needle):
    """prefill_chunk 0, a context beyond the cache, a 128 GB cache: exit 4 or an
    allocation. Now checked against the programs before the cache is allocated (the
    command in process: runtime.load above already refused it here)."""
    built, _ = onnx_lm
    bad = _rewrite(built.artifact, tmp_path / "bad-settings.artifact", _generation(change))
    with pytest.raises(ArtifactError, match="generation section") as caught:
        runtime.load(bad)  # at load: not left for the first generate to find
    assert needle in str(caught.value)
    _clean(cli_here("generate", str(bad), "--prompt-ids", "1,5", "-n", "2"), 2, needle)


def test_a_consistent_cache_larger_than_memory_is_refused_before_allocation(onnx_lm, tmp_path,
                                                                            monkeypatch):
    from runtime.generation import settings
    built, _ = onnx_lm
    monkeypatch.setattr(settings, "memory_of", lambda device: 1024)  # a 1 KiB machine
    with pytest.raises(ArtifactError, match="more than this machine's 0.0 GiB"):
        runtime.load(built.artifact).generate([1, 5], 2)
