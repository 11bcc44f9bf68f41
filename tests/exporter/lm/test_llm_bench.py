"""The language-model comparison (bench/llm): the tiny random checkpoint, the timing
protocol, and engines run as `python -m bench.llm.compare` runs them, each in its own
process. Hugging Face eager runs in the default suite; llama.cpp and ONNX Runtime GenAI
(the llm-bench extra, which compiles llama.cpp) only under `slow`, skipped without them."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.llm import protocol

from tests.conftest import ROOT  # noqa: E402
NEW = 128
# one thread: the record must say the count it was given (not compare's default, 2); two
# threads of HF eager spin 2-6x the CPU a token on a busy two-core box
THREADS = 1


def compare(ran, work: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    cmd = [sys.executable, "-m", "bench.llm.compare", "--size", "tiny",
           "--threads", str(THREADS), "--repeats", "1", "--work-dir", str(work),
           "--out", str(work / "rows.jsonl"), *args]
    return ran(subprocess.run, cmd, cwd=ROOT, env=env, capture_output=True, text=True,
               timeout=900)


def rows(work: Path) -> dict[str, dict]:
    lines = (work / "rows.jsonl").read_text().splitlines()
    return {r["engine"]: r for r in map(json.loads, lines)}


@pytest.fixture(scope="module")
def eager_run(tmp_path_factory, ran):
    """hf-eager and the same engine registered by a plugin module, on the tiny checkpoint."""
    import torch
    from bench.llm.checkpoint import ensure_checkpoint

    work = tmp_path_factory.mktemp("llm")
    # written here, where torch and transformers are loaded already (a process of its own
    # costs ~7 CPU s of imports); compare's own call then finds it by its stamp
    with torch.random.fork_rng():
        ensure_checkpoint("tiny", work / "ckpt-tiny")
    proc = compare(ran, work, "--engines", "hf-eager,hf-eager-plugin",
                   "--engine-module", "tests.llm_engine_plugin")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work, rows(work)


def test_eager_record_counts_exactly_127_decode_steps(eager_run):
    work, by_engine = eager_run
    row = by_engine["hf-eager"]
    assert "error" not in row, row.get("error")
    assert (row["prompt_tokens"], row["new_tokens"], row["decode_steps"]) == (128, NEW, NEW - 1)
    assert len(row["token_ids"]) == NEW and row["deterministic"] is True
    assert row["threads"] == THREADS and row["device"] == "cpu" and len(row["runs"]) == 1
    run = row["runs"][0]
    assert row["decode_tok_s"] == pytest.approx((NEW - 1) / run["decode_s"])
    assert row["prefill_tok_s"] == pytest.approx(128 / run["ttft_s"])
    ckpt = work / "ckpt-tiny"
    assert row["file_bytes"] == (ckpt / "model.safetensors").stat().st_size
    # the process's own peak, above what it held before the model loaded
    assert row["peak_rss_mb"] > row["rss_before_load_mb"] + row["file_bytes"] / 2**20 / 2
    assert row["prefix_ref"] == "hf-eager" and row["prefix"] == NEW
    assert row["versions"]["torch"] and row["cpu"] and row["size"] == "tiny"


def test_plugin_engine_runs_in_its_own_process_with_the_same_ids(eager_run):
    _, by_engine = eager_run
    plugin = by_engine["hf-eager-plugin"]
    assert plugin["token_ids"] == by_engine["hf-eager"]["token_ids"]
    assert plugin["prefix"] == NEW


def test_render_prints_one_table_row_per_engine(eager_run, ran):
    work, _ = eager_run
    proc = ran(subprocess.run, [sys.executable, "-m", "bench.llm.compare", "--render",
                                str(work / "rows.jsonl")], cwd=ROOT, capture_output=True,
               text=True)
    assert proc.returncode == 0, proc.stderr
    table = [line for line in proc.stdout.splitlines() if line.startswith("| hf-eager")]
    assert len(table) == 2 and all(f"{NEW}/{NEW}" in line for line in table)


def test_tiny_checkpoint_has_a_llama_layout_tokenizer(eager_run):
    from tokenizers import Tokenizer

    work, _ = eager_run
    tok = Tokenizer.from_file(str(work / "ckpt-tiny" / "tokenizer.json"))
    assert tok.get_vocab_size() == 4096
    assert [tok.token_to_id(t) for t in ("<unk>", "<s>", "</s>", "<0x00>", "<0xFF>")] == \
        [0, 1, 2, 3, 258]
    text = "def f(x):\n    return x  # héllo"
    ids = tok.encode(text).ids
    assert ids[0] == 1 and tok.decode(ids) == text


def test_protocol_times_on_token_stamps_and_rejects_a_short_generation():
    def generate(prompt, new_tokens, on_token):
        time.sleep(0.02)  # "prefill"
        for i in range(new_tokens):
            on_token(prompt[-1] + i)
            time.sleep(0.002)

    record = protocol.measure("fake", "-", generate, [5] * 16, new_tokens=10, repeats=3)
    assert record.decode_steps == 9 and record.token_ids == list(range(5, 15))
    assert record.ttft_s >= 0.02 and record.prefill_tok_s == pytest.approx(16 / record.ttft_s)
    assert 9 / 0.1 < record.decode_tok_s < 9 / 0.018  # about 9 sleeps of 2 ms
    with pytest.raises(RuntimeError, match="generated 9 tokens, not 10"):
        protocol.measure("short", "-", lambda p, n, cb: [cb(1) for _ in range(n - 1)],
                         [5], new_tokens=10)
    assert protocol.prompt_ids(4096, 128, 0) == protocol.prompt_ids(4096, 128, 0)
    assert protocol.common_prefix([1, 2, 3], [1, 2, 4]) == 2


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@pytest.mark.slow
@pytest.mark.skipif(not _have("llama_cpp"), reason="llama-cpp-python is not installed "
                    "(the llm-bench extra: make bench-llm)")
def test_llamacpp_engines_convert_the_same_weights(eager_run, ran):
    converter = ROOT / "build/llm/llama.cpp/convert_hf_to_gguf.py"
    if not converter.is_file() and "LLAMA_CPP_CONVERTER" not in os.environ:
        pytest.skip("llama.cpp's converter is not extracted (python -m "
                    "bench.llm.engines_llamacpp --extract SDIST, or make bench-llm)")
    work, _ = eager_run
    proc = compare(ran, work, "--engines", "llamacpp-f32,llamacpp-q8_0,llamacpp-q4_0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_engine = rows(work)
    for name in ("llamacpp-f32", "llamacpp-q8_0", "llamacpp-q4_0"):
        assert "error" not in by_engine[name], by_engine[name].get("error")
        assert by_engine[name]["decode_steps"] == NEW - 1
    # f32 GGUF: the same weights, so greedy ids agree with Hugging Face for long (random
    # weights leave near-ties, so not necessarily all 128)
    assert by_engine["llamacpp-f32"]["prefix"] >= 16
    assert by_engine["llamacpp-q4_0"]["file_bytes"] < by_engine["llamacpp-f32"]["file_bytes"] / 4


@pytest.mark.slow
@pytest.mark.skipif(not _have("onnxruntime_genai"), reason="onnxruntime-genai is not "
                    "installed (the llm-bench extra: make bench-llm)")
def test_ortgenai_engines_build_and_agree_at_fp32(eager_run, ran):
    work, _ = eager_run
    proc = compare(ran, work, "--engines", "ortgenai-fp32,ortgenai-int4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_engine = rows(work)
    for name in ("ortgenai-fp32", "ortgenai-int4"):
        assert "error" not in by_engine[name], by_engine[name].get("error")
        assert by_engine[name]["decode_steps"] == NEW - 1
    assert by_engine["ortgenai-fp32"]["prefix"] >= 16
