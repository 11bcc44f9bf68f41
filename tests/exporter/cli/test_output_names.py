"""Default output names do not collide across files, and an artifact built from another
spec is not replaced without --force (exit 2, the file untouched)."""

import json
import shutil

import pytest

import exporter
from exporter.builder.pipeline import dry_run
from exporter.builder.replacing import recorded_spec
from exporter.errors import UserInputError
from exporter.settings import BuildSettings
from runtime import read_manifest

_FACTORY = ("import torch\n\ndef factory():\n"
            "    return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()), "
            "(torch.randn(2, 8),)\n")


def test_another_specs_artifact_at_the_default_name_is_refused_then_forced(
        onnx_mlp, tmp_path, monkeypatch):
    """mlp.py:factory's default name is where zoo:mlp's artifact already lies."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mlp.py").write_text(_FACTORY)
    taken = tmp_path / "mlp-onnx.artifact"
    shutil.copy(onnx_mlp, taken)
    before = taken.read_bytes()
    with pytest.raises(UserInputError, match=r"'zoo:mlp', not from 'mlp\.py:factory'") as caught:
        exporter.build("mlp.py:factory", target="onnx")
    assert caught.value.exit_code == 2 and "--force" in caught.value.hint
    assert taken.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "nothing half-written"
    built = exporter.build("mlp.py:factory", target="onnx", force=True, validate_artifact=False)
    assert built.artifact.resolve() == taken and recorded_spec(taken) == "mlp.py:factory"
    assert "force" not in read_manifest(taken).build["settings"], "where, not what: unrecorded"
    # the same spec, spelled another way, goes on replacing its own artifact
    dry_run("./mlp.py:factory", BuildSettings(target="onnx"))


def test_the_cli_refusal_names_both_specs_and_the_flag(
        onnx_mlp, tmp_path, cli_here):
    taken = tmp_path / "encoder.artifact"
    shutil.copy(onnx_mlp, taken)
    refused = cli_here("build", "zoo:encoder", "--target", "onnx", "--out", str(taken), "--json")
    assert refused.returncode == 2, refused.stderr
    error = json.loads(refused.stdout)["error"]
    assert "'zoo:mlp'" in error["what"] and "'zoo:encoder'" in error["what"]
    assert "--force" in error["hint"] and taken.read_bytes() == onnx_mlp.read_bytes()


def test_a_file_that_is_no_artifact_records_no_spec(tmp_path):
    """Such a file is replaced as before (a failed build keeps it; see test_bad_inputs)."""
    junk = tmp_path / "junk.artifact"
    junk.write_bytes(b"previous good artifact")
    assert recorded_spec(junk) is None and recorded_spec(tmp_path / "none.artifact") is None
