"""A failed validation is bisected to the partition that parts from eager (DESIGN.md).

tests/models/nan_argmax.py builds for onnx into ORT, torch (a custom op), ORT; only the last
partition really differs from eager (ORT's ArgMax skips the NaN that torch.argmax picks).
The capture branch (every partition fine, the export itself differs) is checked with the
export_differs model in test_bad_inputs.py."""

from __future__ import annotations

import json

import pytest

import runtime

pytest.importorskip("onnxruntime")
MODEL = "tests/models/nan_argmax.py:factory"


def test_the_first_divergent_partition_is_named_with_its_ops_and_lines(cli, tmp_path):
    out = tmp_path / "nan.artifact"
    result = cli("build", MODEL, "--target", "onnx", "--fallback", "allow", "--out", str(out),
                 "--keep-failed", "--json")
    assert result.returncode == 1, result.stderr
    found = json.loads(result.stdout)["validation"]["bisect"]
    rows = {row["partition"]: row for row in found["partitions"]}
    print("bisect:", {name: row["diverges"] for name, row in rows.items()})
    assert [(r["backend"], r["diverges"]) for r in found["partitions"]] == [
        ("onnxruntime", False), ("torch", False), ("onnxruntime", True)]
    assert found["first_divergent"] == "p2"
    assert rows["p2"]["outputs"][0]["mismatches"] > 0
    ops = {op["op"]: op["source"] for op in found["ops"]}
    assert "nan_argmax.py:28 in forward" in ops["aten.argmax.default"]
    # The library's frame gives way to the model's own line for the linear too.
    assert all("nan_argmax.py" in source for source in ops.values()), ops
    assert "p2 (onnxruntime @ cpu): 'output'" in result.stderr
    assert "<- first to diverge" in result.stderr and "p2 runs aten.argmax.default" in result.stderr
    assert not out.exists()
    kept = out.with_name("nan.FAILED-VALIDATION.artifact")
    assert runtime.read_manifest(kept).validation["bisect"]["first_divergent"] == "p2"
