"""Target tvm end to end through the CLI: the zoo with a dynamic batch, a Hugging Face
encoder and a GPT-2-style decoder, CPU fallback for a custom op, and a partition TVM
fails to compile (cumsum over a bool mask) moved to the CPU and retried."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import runtime
from exporter.model.zoo import ZOO
from tests.helpers import assert_runs_on_numpy_without_torch, assert_zoo_artifact_matches_eager

pytest.importorskip("tvm")
CUSTOM = "tests/models/custom_op.py:factory"
CUMSUM = "tests/models/bool_cumsum.py:factory"


def _build(cli, out, spec, *extra):
    result = cli("build", spec, "--target", "tvm", "--out", str(out), "--json", *extra)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["validation"]["passed"] is True
    return data


# make test keeps the MLP and the encoder (attention, layer norms); the CNN and the decoder
# (13-16 s each) run in make test-slow, and the coverage matrix builds larger ones on tvm
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow)
                                  if name in ("cnn", "decoder") else name
                                  for name in sorted(ZOO)])
def test_zoo_builds_and_runs_on_tvm_with_dynamic_batch(name, artifacts_dir, cli_here):
    out = artifacts_dir / f"zoo-{name}-tvm.artifact"
    _build(cli_here, out, f"zoo:{name}")
    manifest = runtime.read_manifest(out)
    (partition,) = manifest.partitions
    assert partition.backend == "tvm" and partition.meta["tvm_target"].startswith("llvm")
    schedules = partition.meta["schedules"]["prim_funcs"]
    assert schedules.get("parallel+vectorized", 0) > 0, schedules  # not TVM's scalar loops
    # every zoo model has matmuls or convolutions: tiled, not TVM's scalar default
    assert partition.meta["schedules"]["rules"].get("TiledContraction", 0) > 0
    assert_zoo_artifact_matches_eager(out, name)


def test_a_tvm_artifact_runs_on_numpy_arrays_without_torch(artifacts_dir, cli_here, ran, tmp_path):
    """A device with TVM and numpy, no torch (the zoo test above builds this artifact)."""
    out = artifacts_dir / "zoo-mlp-tvm.artifact"
    if not out.exists():
        _build(cli_here, out, "zoo:mlp")
    x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    assert_runs_on_numpy_without_torch(ran, out, x, tmp_path)


def test_a_tvm_artifact_loads_without_tvms_scope_warnings(artifacts_dir, cli_here, ran,
                                                        tmp_path):
    """TVM logs each memory scope of a Relax VM it loads as a warning on stderr: every
    `exporter run` of a tvm artifact began with such lines (runtime/executors/tvm.py)."""
    import subprocess
    import sys
    out = artifacts_dir / "zoo-encoder-tvm.artifact"  # its VM has memory scopes; the MLP's none
    if not out.exists():
        _build(cli_here, out, "zoo:encoder")
    ids, mask = ZOO["encoder"]()[1]
    np.savez(tmp_path / "in.npz", input_ids=ids.numpy(), attention_mask=mask.numpy())
    done = ran(subprocess.run, [sys.executable, "-m", "runtime", "run", str(out), "--inputs",
                                str(tmp_path / "in.npz"), "--out", str(tmp_path / "out.npz")],
               capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Scope Loaded" not in done.stderr, done.stderr


def test_a_partition_tvm_cannot_compile_moves_the_op_to_cpu(artifacts_dir, cli_here):
    out = artifacts_dir / "cumsum-tvm.artifact"
    data = _build(cli_here, out, CUMSUM)
    assert any("moved to the CPU fallback" in w and "cumsum" in w for w in data["warnings"])
    manifest = runtime.read_manifest(out)
    (row,) = [r for r in manifest.coverage if r["backend"] == "torch"]
    assert row["op"] == "aten.cumsum.default" and "tvm failed to compile it" in row["reason"]
    # the build recovered: the failed compile's log is not left beside the artifact
    assert not list(out.parent.glob("exporter-tvm-*"))


def test_forbid_names_the_op_tvm_failed_on(cli_here, tmp_path):
    out = tmp_path / "forbid.artifact"
    result = cli_here("build", CUMSUM, "--target", "tvm", "--fallback", "forbid", "--out",
                      str(out))
    assert result.returncode == 3 and "Traceback" not in result.stderr
    assert "partition 'p0'" in result.stderr and "cumsum" in result.stderr
    assert not out.exists()


@pytest.mark.slow  # minutes of TVM compiles; the coverage suite builds these architectures on tvm
def test_hf_encoder_and_gpt2_decoder_on_tvm(artifacts_dir, cli_here):
    pytest.importorskip("transformers")
    _build(cli_here, artifacts_dir / "bert-tvm.artifact", "tests/models/hf_bert.py:tiny_bert",
           "--dynamic", "input_ids:0=1..8", "--dynamic", "attention_mask:0=1..8")
    _build(cli_here, artifacts_dir / "gpt2-tvm.artifact", "tests/models/hf_gpt2.py:tiny_gpt2")


def test_bad_tvm_target_is_a_usage_error(cli_here, tmp_path):
    result = cli_here("build", "zoo:mlp", "--target", "tvm", "--tvm-target", "cuda",
                      "--out", str(tmp_path / "x.artifact"))
    assert result.returncode == 2 and "not a CPU (llvm) target" in result.stderr
    assert "Traceback" not in result.stderr


def test_tune_leaves_dynamic_shapes_to_the_rules_and_says_so(cli_here, tmp_path):
    data = _build(cli_here, tmp_path / "tuned.artifact", "zoo:mlp", "--tune", "4")
    assert any("dynamic shapes" in w and "--tune" in w for w in data["warnings"])
    tuning = runtime.read_manifest(tmp_path / "tuned.artifact").partitions[0].meta["schedules"]
    assert tuning["tuning"]["tuned_tasks"] == 0 and tuning["tuning"]["dynamic_shape_tasks"] > 0
    assert tuning["rules"].get("TiledContraction", 0) > 0  # untuned rules, not scalar loops


@pytest.mark.slow
def test_tune_runs_metaschedule_on_static_shapes(cli_here, tmp_path):
    pytest.importorskip("psutil")
    out = tmp_path / "tuned.artifact"
    _build(cli_here, out, "bench/static_zoo.py:mlp", "--tune", "4")
    (partition,) = runtime.read_manifest(out).partitions
    schedules = partition.meta["schedules"]
    assert partition.meta["tune_trials"] == 4 and schedules["how"].startswith("MetaSchedule")
    assert schedules["tuning"]["tuned_tasks"] > 0 and schedules["tuning"]["dynamic_shape_tasks"] == 0


def test_weight_only_value_from_a_fallback_partition_is_a_constant(monkeypatch, tmp_path):
    """A tied head reads ``tokens.weight.T`` (zoo:decoder's does). Forced onto the CPU, that
    transpose feeds the TVM partition a value computed from weights alone; it must
    arrive as a constant (TVM's import failed on torch.export's guard for it as an input).
    The head alone (tests/models/tied_head.py): the decoder's blocks took 15 of 18 CPU s."""
    from pathlib import Path

    from exporter.builder.pipeline import build
    from exporter.settings import BuildSettings
    from targets.base import Support
    from targets.tvm.target import TvmTarget

    supports = TvmTarget.supports

    def without_transpose(self, node):
        if getattr(node.target, "__name__", "").startswith(("numpy_T", "permute", "t.")) \
                and "weight" in str(node.args[0]):
            return Support(False, "test: kept on the CPU")
        return supports(self, node)

    monkeypatch.setattr(TvmTarget, "supports", without_transpose)
    from tests.models import tied_head
    out = Path(tmp_path) / "tied.artifact"
    result = build("tests.models.tied_head:factory", BuildSettings(target="tvm", out=out))
    backends = {p.backend: p for p in result.manifest.partitions}
    assert set(backends) == {"torch", "tvm"} and list(backends["tvm"].inputs) == ["input_ids"]
    assert result.manifest.validation["passed"]
    model, (ids,) = tied_head.factory()
    with torch.no_grad():
        torch.testing.assert_close(runtime.load(out)(ids), model(ids), rtol=1e-4, atol=1e-5)


class _LastRows(torch.nn.Module):
    def forward(self, x):
        return x.select(2, -2) * 2.0, x[-1] + 1.0  # dim 2 static, dim 0 (batch) dynamic


def test_a_select_at_a_negative_index_reads_that_row_not_memory_past_it(tmp_path):
    """TVM imports select(x, dim, -k) as a take that reads out of bounds (BigBird's last
    block: 0.05 off and NaN): a static dim's index is made positive, a dynamic one's
    select runs on the CPU fallback, named; the build validates either way."""
    import exporter
    from torch.export import Dim
    x = torch.randn(4, 3, 5)
    built = exporter.build(_LastRows(), (x,), target="tvm", out=tmp_path / "rows.artifact",
                           dynamic_shapes=({0: Dim("batch", min=2, max=8)},))
    assert built.manifest.validation["passed"]
    placed = {(row["op"], row["backend"]): row["reason"] for row in built.manifest.coverage}
    assert ("aten.select.int", "tvm") in placed
    assert "negative index of a dynamic dim" in placed[("aten.select.int", "torch")]


class _BlockIds(torch.nn.Module):
    def forward(self, mask):
        ones = torch.ones_like(mask) / 4  # int64 / int: true division, float32
        return torch.cumsum(ones, 1) - ones


def test_true_division_of_integers_runs_in_float_on_tvm(tmp_path):
    """TVM's importer divided int64 operands as integers where PyTorch returns float32
    (LongT5's block ids: the build failed validation): the operands are cast first and
    the division stays on TVM."""
    import exporter
    built = exporter.build(_BlockIds(), (torch.ones(2, 8, dtype=torch.int64),), target="tvm",
                           out=tmp_path / "ids.artifact")
    assert built.manifest.validation["passed"]
    assert ("aten.div.Tensor", "tvm") in {(row["op"], row["backend"])
                                          for row in built.manifest.coverage}
    program = runtime.load(tmp_path / "ids.artifact")
    got = program(torch.ones(2, 8, dtype=torch.int64))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, _BlockIds()(torch.ones(2, 8, dtype=torch.int64)))


class _EmptyCache(torch.nn.Module):
    """transformers' DynamicCache before its first update: keys start as tensor([])."""

    def __init__(self):
        super().__init__()
        self.register_buffer("keys", torch.tensor([]))

    def forward(self, k):
        return torch.cat([self.keys, k], dim=-2).softmax(-1)


def test_a_cat_with_an_empty_legacy_operand_stays_on_tvm(tmp_path):
    """torch.cat skips a (0,) operand; TVM's importer refused the Concat of mixed ranks
    and XLM's four cats ran on the CPU fallback: the empty operand is dropped first."""
    import exporter
    k = torch.randn(1, 2, 5, 4)
    built = exporter.build(_EmptyCache(), (k,), target="tvm", out=tmp_path / "cat.artifact")
    assert built.manifest.validation["passed"]
    assert {row["backend"] for row in built.manifest.coverage} == {"tvm"}
    torch.testing.assert_close(runtime.load(tmp_path / "cat.artifact")(k), _EmptyCache()(k))
