"""bench/compare_targets.py: its variants, build cache and table, without building."""

from __future__ import annotations

import json

from bench import compare_targets
from bench.common import wait_for_quiet


def _row(model: str, timings: dict, errors: dict | None = None) -> dict:
    return {"date": "2026-11-28", "cpu": "cpu", "cores": 2, "python": "3.11", "torch": "2",
            "onnxruntime": "1", "executorch": "1.5.1", "runs": 10, "threads": {"torch": 2},
            "focus": "executorch", "model": model, "errors": errors or {},
            "load": {"min": 2.0, "max": 2.4, "mean": 2.2},
            "timings": {k: {"median_ms": v} for k, v in timings.items()}}


def test_a_quantized_variant_is_a_quantize_build_and_static_calibrates():
    got = dict((label, flags) for label, _, flags in compare_targets.variants(
        "bench/models.py:bert_base", ["executorch", "executorch:int8-static",
                                      "onnx:int8-dynamic"], tune=0))
    assert got["executorch"] == ["--target", "executorch"]
    assert got["executorch:int8-static"][-2:] == ["--calibration", "random"]
    assert got["onnx:int8-dynamic"] == ["--target", "onnx", "--quantize", "int8-dynamic"]


def test_a_failed_build_is_read_from_the_cache_not_retried(tmp_path, monkeypatch):
    sidecar = tmp_path / "m-executorch.build.json"
    sidecar.write_text(json.dumps({"error": "op X has no kernel", "build_s": 1.0,
                                   "command": "python -m exporter build"}))
    monkeypatch.setattr(compare_targets.subprocess, "run",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("rebuilt")))
    info = compare_targets.build_one("executorch", "zoo:m", [], tmp_path, "m")
    assert info["error"] == "op X has no kernel"


def test_table_splits_fp32_from_int8_and_takes_the_fastest_peer():
    text = compare_targets.render_rows([_row("bert", {
        "eager": 100.0, "ort": 80.0, "cpu": 60.0, "executorch": 90.0,
        "cpu:int8-static": 30.0, "executorch:int8-static": 45.0,
        "executorch:int8-dynamic": 40.0}, {"onnx": "op Y unsupported"})])
    fp32_line = next(line for line in text.splitlines() if line.startswith("| bert |"))
    assert "| 0.90 | 1.50 (cpu) |" in fp32_line  # 90/100 eager, 90/60 the best peer
    int8_line = [line for line in text.splitlines() if line.startswith("| bert |")][1]
    assert "| 0.40 | 1.33 (cpu:int8-static) |" in int8_line  # fastest of ours: dynamic
    assert "- bert onnx: op Y unsupported" in text


def test_waiting_for_a_quiet_machine_returns_at_once_when_it_is_quiet():
    assert wait_for_quiet(max_load=1e9, max_wait_s=0)["waited_s"] == 0
