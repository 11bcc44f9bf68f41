"""The coverage matrix's fast slice (bench/coverage/suite.py, ``fast=True``): real Hugging
Face architectures from configs (a ResNet, a ViT, BERT, a LLaMA with grouped-query
attention, T5, wav2vec2), each built in its own process by `exporter matrix` (through
bench/coverage/matrix.py) exactly as `make coverage` builds the whole suite. Every cell must
build and validate; a failure names its cells (stage, typed error). The whole matrix:
`make coverage`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, _record

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")


def _matrix(tmp_path, targets: str, models: str | None = None) -> list[dict]:
    cmd = [sys.executable, "-m", "bench.coverage.matrix", "--targets", targets, "--timeout",
           "300", "--out", str(tmp_path)]
    cmd += ["--models", models] if models else ["--fast"]
    _record(cmd)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "matrix.json").read_text())["cells"]
    assert (tmp_path / "matrix.csv").read_text().count("\n") == len(rows) + 1
    return rows


def _assert_all_built(rows: list[dict], expected: int) -> None:
    assert len(rows) == expected
    failed = [r for r in rows if r["status"] != "ok"]
    assert not failed, "\n".join(f"{r['model']} on {r['target']}: {r['status']} in "
                                 f"{r.get('stage')}: {r.get('error')}" for r in failed)
    for row in rows:
        assert row["error_ratio"] is not None and row["error_ratio"] <= 1.0
        assert row["arena_over_lower_bound"] is not None and row["arena_over_lower_bound"] >= 1


@pytest.mark.slow  # six builds would push `make test` past its time budget; the whole
# onnx matrix (`make coverage`) covers these models instead
def test_fast_slice_builds_and_validates_on_onnx(tmp_path):
    rows = _matrix(tmp_path, "onnx")
    _assert_all_built(rows, 6)
    assert {r["group"] for r in rows} >= {"cnn", "vit", "encoder", "decoder",
                                            "encoder-decoder", "audio"}


@pytest.mark.slow  # two more compiles: keeps `make test` near 15 minutes on 2 cores
def test_a_modern_decoder_builds_on_cpu_and_tvm(tmp_path):
    """LLaMA (GQA, RoPE, RMSNorm, causal mask): the architecture every decoder family shares."""
    pytest.importorskip("tvm")
    rows = _matrix(tmp_path, "cpu,tvm", "llama")
    _assert_all_built(rows, 2)
