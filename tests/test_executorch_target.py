"""Target executorch end to end through the CLI: the zoo MLP and CNN with a dynamic batch
(run at both ends of its range), the dry run's per-op placement (XNNPACK delegate or
ExecuTorch kernel, with the reason), ops ExecuTorch has no kernel for on the CPU
fallback (and listed under --fallback forbid), and a .pte ExecuTorch refuses."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import runtime
from runtime.format.archive import ArtifactReader
from exporter.ship.archive_writer import write_artifact
from runtime.errors import ArtifactError
from tests.helpers import assert_zoo_artifact_matches_eager

pytest.importorskip("executorch")
GAPS = "tests/models/executorch_gaps.py"


def _build(cli, out, spec, *extra):
    result = cli("build", spec, "--target", "executorch", "--out", str(out), "--json", *extra)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["validation"]["passed"] is True
    return data


@pytest.fixture(scope="module")
def zoo_built(artifacts_dir, cli):
    """zoo name -> its executorch artifact, built once for this module."""
    built = {}

    def get(name: str):
        if name not in built:
            out = artifacts_dir / f"zoo-{name}-executorch.artifact"
            _build(cli, out, f"zoo:{name}")
            built[name] = out
        return built[name]
    return get


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_zoo_model_runs_on_executorch_at_both_ends_of_its_batch_range(name, zoo_built):
    out = zoo_built(name)
    (partition,) = runtime.read_manifest(out).partitions
    meta = partition.meta
    assert partition.backend == "executorch" and meta["program"].endswith(".pte")
    assert meta["xnnpack_ops"] > 0 and meta["delegates"] >= 1
    # ExecuTorch's arenas are planned for the largest batch, not the example's
    assert meta["planned_bytes"] == sum(meta["buffer_sizes"]) > 0
    assert list(meta["bounds"].values()) == ["1..32"]
    assert_zoo_artifact_matches_eager(out, name, batches=(1, 17, 32))


def test_dry_run_says_per_op_whether_xnnpack_or_an_executorch_kernel_runs_it(cli):
    result = cli("build", "zoo:cnn", "--target", "executorch", "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["op"]: row for row in json.loads(result.stdout)["coverage"]}
    assert rows["aten.convolution.default"]["reason"] == "XNNPACK delegate (ConvolutionConfig)"
    # a reshape by the dynamic batch: XNNPACK's config refuses it, a kernel runs it
    assert rows["aten.view.default"]["reason"].startswith("portable kernel aten::view_copy.out")
    assert {row["backend"] for row in rows.values()} == {"executorch"}


def test_an_op_executorch_has_no_kernel_for_runs_on_the_cpu_fallback(artifacts_dir, cli):
    out = artifacts_dir / "gaps-executorch.artifact"
    _build(cli, out, f"{GAPS}:factory")
    manifest = runtime.read_manifest(out)
    assert [p.backend for p in manifest.partitions] == ["executorch", "torch", "executorch"]
    (row,) = [r for r in manifest.coverage if r["backend"] == "torch"]
    assert row["op"] == "aten.i0.default" and "no ExecuTorch kernel" in row["reason"]
    from tests.models.executorch_gaps import factory
    module, _, _ = factory()
    batch = torch.randn(16, 16)
    torch.testing.assert_close(runtime.load(out)(batch), module(batch), rtol=1e-4, atol=1e-4)


def test_fallback_forbid_lists_every_op_executorch_cannot_run(cli, tmp_path):
    out = tmp_path / "forbid.artifact"
    result = cli("build", f"{GAPS}:two_factory", "--target", "executorch",
                 "--fallback", "forbid", "--out", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "aten.i0.default" in result.stderr and "aten.logcumsumexp.default" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("program", [b"", b"ET12" + b"\x00" * 60, b"\x1c\x00\x00\x00ET12" * 40],
                         ids=["empty", "header-only", "garbage"])
def test_a_pte_executorch_refuses_is_a_bad_artifact_not_a_crash(zoo_built, tmp_path, cli,
                                                                 program):
    """A .pte whose hash matches its manifest (a rebuilt manifest) that ExecuTorch's
    verifier refuses: ArtifactError on load, exit 2 from `exporter run`."""
    good = zoo_built("mlp")
    with ArtifactReader.open(good) as reader:
        manifest = json.loads(json.dumps(reader.manifest))
        entries = {name: reader.read_bytes(name) for name in reader.names()
                   if name != "manifest.json"}
    (entry,) = [name for name in entries if name.endswith(".pte")]
    entries[entry] = program
    bad = write_artifact(tmp_path / "bad.artifact", manifest, entries)
    with pytest.raises(ArtifactError, match="ExecuTorch could not load partition 'p0'"):
        runtime.load(bad)
    np.savez(tmp_path / "in.npz", x=np.zeros((2, 64), np.float32))
    result = cli("run", str(bad), "--inputs", str(tmp_path / "in.npz"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
