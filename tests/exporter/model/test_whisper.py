"""Whisper under --task text-generation: features and WAV audio as the source (the
runtime's log-mel front end against transformers'), both CLIs, the decoder prompt
(language, given or detected; task; forced ids) and token suppression as transformers'
Whisper ``generate`` does them, and the bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import runtime
from runtime.generation.prompting import Suppression
from tests.conftest import ROOT
from tests.models import tiny_seq2seq

pytest.importorskip("transformers")


def test_whisper_generates_from_features_on_both_clis(whisper_onnx, cli_here, tmp_path):
    _, program = whisper_onnx
    features = torch.randn(16, 48, generator=torch.Generator().manual_seed(7))
    import numpy
    numpy.save(tmp_path / "features.npy", features.numpy())
    expected = program.generate(None, 6, source=features, stop_at_eos=False).tokens
    artifact = str(program.source)
    # exporter's in process (its process: test_cli_generate); the runtime's as on a device
    done = cli_here("generate", artifact, "--source-features", str(tmp_path / "features.npy"),
                    "-n", "6", "--ignore-eos", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tokens"] == expected
    runtime_cli = subprocess.run(
        [sys.executable, "-m", "runtime", "generate", artifact, "--source-features",
         str(tmp_path / "features.npy"), "--max-new-tokens", "6", "--ignore-eos", "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert runtime_cli.returncode == 0, runtime_cli.stderr
    assert json.loads(runtime_cli.stdout)["tokens"] == expected


def test_log_mel_equals_whisper_feature_extractor():
    """The runtime's numpy front end against transformers' on 7 s of audio (padded to
    30 s), at Whisper's 80 and large-v3's 128 mel bins."""
    import numpy as np
    from transformers import WhisperFeatureExtractor

    from runtime.generation.audio import Waveform, log_mel
    rng = np.random.default_rng(0)
    samples = (rng.standard_normal(16000 * 7) * 0.1
               * np.sin(np.linspace(0, 300, 16000 * 7))).astype(np.float32)
    audio = {"sampling_rate": 16000, "n_fft": 400, "hop_length": 160}
    for mels in (80, 128):
        reference = WhisperFeatureExtractor(feature_size=mels)(
            samples, sampling_rate=16000, return_tensors="np").input_features[0]
        ours = log_mel(Waveform(samples, 16000), audio, mels, 3000)
        assert ours.shape == reference.shape and np.abs(reference - ours).max() < 1e-4


def test_audio_with_nothing_to_hear_is_refused_and_long_audio_is_cut_with_a_warning(caplog):
    """Empty audio and NaN samples are exit-2 errors (a NaN spectrogram transcribes as
    anything); audio past the window is cut, and the cut is said."""
    import numpy as np

    from runtime.generation.audio import Waveform, log_mel
    audio = {"sampling_rate": 16000, "n_fft": 400, "hop_length": 160}
    for samples, said in ((np.zeros(0, np.float32), "no samples"),
                          (np.array([0.1, np.nan, 0.2], np.float32), "1 samples that are NaN")):
        with pytest.raises(runtime.UserInputError, match=said):
            log_mel(Waveform(samples, 16000), audio, 80, 3000)
    long = np.random.default_rng(0).standard_normal(16000 * 31).astype(np.float32) * 0.1
    with caplog.at_level("WARNING", logger="runtime.generation.audio"):
        cut = log_mel(Waveform(long, 16000), audio, 80, 3000)
    assert cut.shape == (80, 3000) and np.array_equal(
        cut, log_mel(Waveform(long[:16000 * 30], 16000), audio, 80, 3000))
    assert "31.0 s long; only its first 30.0 s" in caplog.text


def _wav(path, samples, rate: int):
    import wave

    import numpy as np
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return path


def test_whisper_generates_from_a_wav_file(whisper_onnx, cli_here, tmp_path):
    import numpy as np

    from runtime.generation.audio import log_mel, read_wav
    _, program = whisper_onnx
    samples = np.random.default_rng(3).uniform(-0.5, 0.5, 5000)
    path = _wav(tmp_path / "speech.wav", samples, 16000)
    source = program.manifest.generation.source
    features = log_mel(read_wav(path), source["audio"], *source["shape"])
    expected = program.generate(None, 6, source=torch.from_numpy(features),
                                stop_at_eos=False).tokens
    assert program.generate(None, 6, source=read_wav(path), stop_at_eos=False).tokens == expected
    done = cli_here("generate", str(program.source), "--source-audio", str(path), "-n", "6",
                    "--ignore-eos", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tokens"] == expected
    for bad, said in ((_wav(tmp_path / "8k.wav", samples, 8000), "sampled at 8000 Hz"),
                      (tmp_path / "features.npy", "not a readable PCM WAV")):
        if not bad.exists():
            bad.write_bytes(b"not audio")
        done = cli_here("generate", str(program.source), "--source-audio", str(bad), "-n", "2")
        assert done.returncode == 2 and said in done.stderr


def test_whisper_prompts_and_suppresses_as_transformers_generate(whisper_onnx):
    """With no decoder prompt given, the artifact starts as transformers' Whisper
    ``generate`` does (start, language (detected when not given), task, no timestamps)
    and never emits the config's suppressed ids: the same tokens, on a multilingual
    checkpoint's generation config (tests/models/tiny_seq2seq.py)."""
    _, program = whisper_onnx
    generator = program.generator
    model = tiny_seq2seq.whisper()
    eos = model.generation_config.eos_token_id
    features = torch.randn(16, 48, generator=torch.Generator().manual_seed(7))
    suppression_mattered = []
    for language, task in ((None, None), ("fr", "translate"), ("en", None), (None, "translate"),
                           ("German", None)):  # a name, as transformers takes it too
        with torch.no_grad():
            want = model.generate(input_features=features[None], language=language,
                                  task=task, max_new_tokens=8)[0].tolist()
        got = program.generate(None, 8, source=features, language=language, task=task)
        kept, generator.suppress = generator.suppress, Suppression({}, generator.vocab, generator.device)
        try:
            raw = program.generate(None, 8, source=features, language=language, task=task)
        finally:
            generator.suppress = kept
        assert got.tokens == [t for t in want if t != eos]
        assert got.stop_reason == ("eos" if eos in want else "max_new_tokens")
        assert got.prompt_tokens[0] == 1 and got.prompt_tokens[-1] == 305  # <|notimestamps|>
        assert got.prompt_tokens[1] in (300, 301, 302)  # a language, given or detected
        suppression_mattered.append(raw.tokens != got.tokens)
    assert any(suppression_mattered)  # the suppressed ids are ones this model picks


def test_older_whisper_configs_prompt_from_forced_decoder_ids():
    """Checkpoints saved before transformers' language/task flags carry
    ``forced_decoder_ids`` ([[1, None], [2, transcribe]]: language left to detection);
    transformers prompts from them when no language or task is given, as here."""
    from runtime.generation.prompting import speech_prompt
    config = {**tiny_seq2seq.WHISPER_GENERATION, "forced_decoder_ids": [[1, None], [2, 304]]}
    asked = []

    def detect(prompt, candidates):
        asked.append((prompt, candidates))
        return 301
    assert speech_prompt(config, [1], None, None, detect, "t") == [1, 301, 304, 305]
    assert asked == [([1], [300, 301, 302])]
    config["forced_decoder_ids"] = [[1, 300], [2, 303]]
    assert speech_prompt(config, [1], None, None, detect, "t") == [1, 300, 303, 305]
    assert speech_prompt(config, [1], "de", None, detect, "t") == [1, 302, 304, 305]
    assert len(asked) == 1  # a language in the forced ids, or given: nothing to detect


def test_language_and_task_are_checked(whisper_onnx, bart_onnx, cli_here, tmp_path):
    whisper, bart = whisper_onnx[1], bart_onnx[1]
    features = torch.zeros(16, 48)
    for call, said in (
            (lambda: whisper.generate(None, 2, source=features, language="xx"),
             "language 'xx' is not one this model knows"),
            (lambda: whisper.generate(None, 2, source=features, task="summarize"),
             "task 'summarize' is not one this model knows"),
            (lambda: whisper.generate([1, 300], 2, source=features, language="en"),
             "this call gives its own"),
            (lambda: bart.generate(None, 2, source="hello", language="en"),
             "takes no language or task tokens")):
        with pytest.raises(runtime.UserInputError, match=said):
            call()
    import numpy
    numpy.save(tmp_path / "features.npy", features.numpy())
    done = cli_here("generate", str(whisper.source), "--source-features",
                    str(tmp_path / "features.npy"), "--language", "xx", "-n", "2")
    assert done.returncode == 2 and "language 'xx'" in done.stderr
    done = cli_here("generate", str(whisper.source), "--source-features",
                    str(tmp_path / "features.npy"), "--language", "fr", "--task", "translate",
                    "-n", "3", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tokens"] == whisper.generate(
        None, 3, source=features, language="fr", task="translate").tokens


def test_whisper_without_a_source_is_exit_2(whisper_onnx, cli_here):
    done = cli_here("generate", str(whisper_onnx[1].source), "-n", "2")
    assert done.returncode == 2 and "needs a source" in done.stderr
    assert "Traceback" not in done.stderr


def _wav_header(frames: int, rate: int = 16000) -> bytes:
    """A mono 16-bit PCM WAV header whose data chunk claims ``frames`` frames."""
    import struct
    data = min(frames * 2, 2**32 - 2)
    return (b"RIFF" + struct.pack("<I", min(36 + data, 2**32 - 1)) + b"WAVE" + b"fmt "
            + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
            + b"data" + struct.pack("<I", data))


_PEAK = '''
import sys, tracemalloc
from runtime.generation import parse_source
from runtime.generation.audio import log_mel
tracemalloc.start()
waveform = parse_source(None, None, None, sys.argv[1])
features = log_mel(waveform, {"sampling_rate": 16000, "n_fft": 400, "hop_length": 160}, 80, 3000)
print(tracemalloc.get_traced_memory()[1], features.shape)
'''


def test_an_hours_long_wav_costs_the_memory_of_its_30_s_window(tmp_path):
    """--source-audio read the whole file and converted it to float64 before keeping 30 s
    (a 1.5 GB WAV took 13.5 GB). A 2-hour WAV (230 MB, sparse on disk): what reading and
    its log-mel features allocate stays near the window's few MB."""
    path = tmp_path / "two-hours.wav"
    frames = 16000 * 7200
    with open(path, "wb") as out:
        out.write(_wav_header(frames))
        out.truncate(44 + 2 * frames)  # a hole: nothing written, reads as silence
    done = subprocess.run([sys.executable, "-c", _PEAK, str(path)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    peak, shape = done.stdout.split(" ", 1)
    assert shape.strip() == "(80, 3000)"
    assert int(peak) < 64 * 2**20, f"{int(peak) / 2**20:.0f} MiB for a {2 * frames >> 20} MiB file"
    assert "2.0 h long; only its first 30.0 s" in done.stderr


def test_truncated_empty_and_foreign_wav_files_are_said_or_refused(whisper_onnx, cli_here,
                                                                  tmp_path):
    """A data chunk shorter than its header claims (4 GB claimed, 1 s there) is transcribed
    with a one-line warning saying both lengths; a header with no frames and a file that is
    not a WAV are exit 2 with one error paragraph."""
    import numpy as np
    _, program = whisper_onnx
    speech = np.random.default_rng(5).integers(-8000, 8000, 16000).astype("<i2").tobytes()
    truncated = tmp_path / "truncated.wav"
    truncated.write_bytes(_wav_header(2**31) + speech)
    done = cli_here("generate", str(program.source), "--source-audio", str(truncated), "-n", "2",
                    "--ignore-eos", "--json")
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)
    said = [line for line in done.stderr.splitlines() if "shorter than its header" in line]
    assert len(said) == 1 and "1.0 s" in said[0] and "37.3 h" in said[0], done.stderr
    empty = tmp_path / "empty.wav"
    empty.write_bytes(_wav_header(0))
    claimed = tmp_path / "claimed-only.wav"
    claimed.write_bytes(_wav_header(16000 * 60))
    foreign = tmp_path / "foreign.wav"
    foreign.write_bytes(b"ID3\x04" + bytes(200))
    for bad, needle in ((empty, "holds no audio frames"), (claimed, "claims 60.0 s"),
                        (foreign, "not a readable PCM WAV")):
        done = cli_here("generate", str(program.source), "--source-audio", str(bad), "-n", "2")
        assert done.returncode == 2 and needle in done.stderr, done.stderr
        assert done.stderr.count("error:") == 1 and "Traceback" not in done.stderr
