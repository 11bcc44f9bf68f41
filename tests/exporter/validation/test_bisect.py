"""A failed validation is bisected to the partition that parts from eager (docs/architecture.md), and
inside an ONNX Runtime partition to the first ONNX value that does.

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


def test_the_first_divergent_partition_is_named_with_its_ops_and_lines(cli_here, tmp_path):
    out = tmp_path / "nan.artifact"
    result = cli_here("build", MODEL, "--target", "onnx", "--fallback", "allow", "--out", str(out),
                      "--keep-failed", "--json")
    assert result.returncode == 1, result.stderr
    found = json.loads(result.stdout)["validation"]["bisect"]
    rows = {row["partition"]: row for row in found["partitions"]}
    assert [(r["backend"], r["diverges"]) for r in found["partitions"]] == [
        ("onnxruntime", False), ("torch", False), ("onnxruntime", True)]
    assert found["first_divergent"] == "p2"
    assert rows["p2"]["outputs"][0]["mismatches"] > 0
    ops = {op["op"]: op["source"] for op in found["ops"]}
    assert "nan_argmax.py:28 in forward" in ops["aten.argmax.default"]
    # The library's frame gives way to the model's own line for the linear too.
    assert all("nan_argmax.py" in source for source in ops.values()), ops
    # Inside the ORT partition ("mark all"): log's values match eager (NaN where eager
    # has NaN), ArgMax's do not.
    inside = found["inside"]
    assert (inside["value"], inside["backend_op"], inside["op"]) == (
        "argmax", "ArgMax", "aten.argmax.default")
    assert inside["compared"] >= 2 and "nan_argmax.py:28" in inside["source"]
    assert "the first to diverge is 'argmax'" in result.stderr
    assert "p2 (onnxruntime @ cpu): 'output'" in result.stderr
    assert "<- first to diverge" in result.stderr and "p2 runs aten.argmax.default" in result.stderr
    assert not out.exists()
    kept = out.with_name("nan.FAILED-VALIDATION.artifact")
    assert runtime.read_manifest(kept).validation["bisect"]["first_divergent"] == "p2"


def test_a_correct_artifact_has_nothing_to_blame(monkeypatch, tmp_path):
    """The zoo encoder (fused, 40-odd ONNX values) builds correctly; with its validation
    made to report a mismatch, the bisect must blame no partition, find the exported
    program equal to the model, and, looking inside the ORT partition anyway, blame no
    value. (Forcing the record isolates the bisect: the build itself is real.)"""
    import exporter.validation.bisect as bisect_module
    import exporter.builder.pipeline as pipeline
    import exporter.builder.plain as plain
    from exporter.errors import ValidationFailedError
    from exporter.settings import BuildSettings
    from targets import get_target

    real_validate, real_bisect, seen = plain.validate, plain.bisect, {}

    def failing_validate(*args, **kwargs):
        record = real_validate(*args, **kwargs)
        record["outputs"][0]["passed"] = record["passed"] = False
        return record

    def bisect_and_look_inside(artifact, manifest, program, case, eager, dtype, device, programs):
        result = real_bisect(artifact, manifest, program, case, eager, dtype, device, programs)
        (partition,) = manifest.partitions
        inputs = [case.inputs[name] for name in partition.inputs]
        seen["inside"] = bisect_module.look_inside(
            artifact, manifest, get_target("onnx"), partition, programs[partition.name], inputs,
            result["limit"], {})
        seen["result"] = result
        return result

    monkeypatch.setattr(plain, "validate", failing_validate)
    monkeypatch.setattr(plain, "bisect", bisect_and_look_inside)
    with pytest.raises(ValidationFailedError):
        pipeline.build("zoo:encoder", BuildSettings(target="onnx", out=tmp_path / "e.artifact"))
    result = seen["result"]
    assert result["first_divergent"] is None
    assert not any(c["diverges"] for c in result["capture"])
    assert seen["inside"]["diverges"] is False and seen["inside"]["compared"] >= 30
