"""The core path end to end on the cpu target: build -> package -> load -> run -> validate.

Artifacts are built once per session (conftest.py) and shared.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import runtime
from exporter.model.zoo import ZOO
from exporter.report.summary_lines import random_note
from runtime.errors import InputMismatchError


def test_mlp_build_validates_and_records_it(mlp_build):
    manifest = mlp_build.manifest
    record = manifest.validation
    assert record["passed"] is True
    assert record["reference_dtype"] == "float64"
    assert {c["origin"] for c in record["cases"]} == {"example", "random-min", "random-max"}
    # the summary says once what random draws can hide and how to give real inputs
    assert any("--inputs FILE.npz" in line for line in random_note(record))
    # random draws hit both ends of the dynamic batch dim
    shapes = {c["origin"]: c["shapes"]["x"][0] for c in record["cases"]}
    assert shapes["random-min"] == 1 and shapes["random-max"] == 32


def test_mlp_manifest_pins_versions_isa_and_hashes(mlp_build):
    with runtime.format.archive.ArtifactReader.open(mlp_build.artifact) as reader:
        raw = reader.manifest
    assert raw["format"]["name"] == "edge-export-artifact"
    assert raw["created_by"]["torch"] == torch.__version__
    assert raw["requirements"]["cpu_flags"], "the ISA the library needs must be recorded"
    assert raw["partitions"][0]["backend"] == "aoti"
    assert set(raw["entries"]) == {"partitions/p0/model.pt2"}
    assert raw["signature"]["inputs"][0]["shape"][0] == {"symbol": "batch", "min": 1, "max": 32}


@pytest.mark.parametrize("batch", [1, 7, 32])
def test_mlp_artifact_matches_eager_across_the_batch_range(mlp_build, batch):
    module, _, _ = ZOO["mlp"]()
    x = torch.randn(batch, 64)
    program = runtime.load(mlp_build.artifact)
    got = program(x)
    torch.testing.assert_close(got, module(x), rtol=1e-4, atol=1e-5)


def test_wrong_inputs_name_the_input(mlp_build):
    program = runtime.load(mlp_build.artifact)
    with pytest.raises(InputMismatchError, match=r"input 'x' dim 0 \(batch\): 33 is outside"):
        program(torch.randn(33, 64))
    with pytest.raises(InputMismatchError, match="expected dtype float32, got float64"):
        program(torch.randn(2, 64, dtype=torch.float64))
    with pytest.raises(InputMismatchError, match="takes 1 input tensor"):
        program(torch.randn(2, 64), torch.randn(2, 64))
    with pytest.raises(InputMismatchError, match="missing input 'x'"):
        program.run({"y": torch.randn(2, 64)})


def test_cli_run_from_npz_and_bad_npz(mlp_build, cli_here, tmp_path):
    x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    result = cli_here("run", str(mlp_build.artifact), "--inputs", str(tmp_path / "in.npz"),
                      "--out", str(tmp_path / "out.npz"))
    assert result.returncode == 0, result.stderr
    module, _, _ = ZOO["mlp"]()
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_allclose(out["output"], module(torch.from_numpy(x)).detach().numpy(),
                                   rtol=1e-4, atol=1e-5)
    np.savez(tmp_path / "bad.npz", x=x.astype(np.float64)[:, :10])
    bad = cli_here("run", str(mlp_build.artifact), "--inputs", str(tmp_path / "bad.npz"))
    assert bad.returncode == 2
    assert "input 'x'" in bad.stderr and "Traceback" not in bad.stderr


def test_cli_validate_and_inspect(mlp_build, cli_here):
    result = cli_here("validate", str(mlp_build.artifact), "--model", "zoo:mlp", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["validation"]["passed"] is True
    shown = cli_here("inspect", str(mlp_build.artifact))
    assert shown.returncode == 0 and "batch[1..32]" in shown.stdout
    inspected = json.loads(cli_here("inspect", str(mlp_build.artifact), "--json").stdout)
    assert inspected["manifest"]["target"] == "cpu" and inspected["signed_by"] is None


# outputs as a dict (a Hugging Face ModelOutput): conftest's BERT build, which
# test_external_model checks too (one AOTInductor compile for both files)
def test_cli_build_json_for_nested_outputs(bert_cpu):
    out, result = bert_cpu
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["artifact"] == str(out) and data["target"] == "cpu"
    assert data["validation"]["passed"] is True
    names = [o["name"] for o in data["signature"]["outputs"]]
    assert names == ["last_hidden_state", "pooler_output"]


def test_nested_outputs_come_back_as_the_model_returns_them(bert_cpu):
    from tests.models.hf_bert import tiny_bert
    out, _ = bert_cpu
    module, args = tiny_bert()
    got = runtime.load(out)(*args)
    expected = module(*args)
    assert isinstance(got, dict) and set(got) == set(expected)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=1e-5)
