"""Partitioning with CPU fallback and the onnx target, end to end through the CLI.

Done-when of the partitioning/onnx issue: a custom op no backend knows falls back to the
CPU and validates; --fallback forbid names it; the zoo and a Hugging Face model build,
validate and run on onnx with a dynamic batch; the runtime's overhead over plain ONNX
Runtime is measured by `exporter bench`.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import runtime
from exporter.model.zoo import ZOO
from tests.helpers import assert_zoo_artifact_matches_eager

pytest.importorskip("onnxruntime")
CUSTOM = "tests/models/custom_op.py:factory"


def test_custom_op_falls_back_to_cpu_and_validates(custom_onnx):
    out, result = custom_onnx
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["validation"]["passed"] is True
    assert any("soft_clip" in w for w in data["warnings"])  # --fallback warn says it
    manifest = runtime.read_manifest(out)
    assert [p.backend for p in manifest.partitions] == ["onnxruntime", "torch", "onnxruntime"]
    (row,) = [r for r in manifest.coverage if r["backend"] == "torch"]
    assert row["op"] == "edgetest.soft_clip.default" and "custom_op.py:26" in row["source"]
    assert manifest.placement["fallback_partitions"] == 1


def test_custom_op_artifact_runs_with_its_library_loaded(custom_onnx, cli, tmp_path):
    out, _ = custom_onnx
    x = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    missing = cli("run", str(out), "--inputs", str(tmp_path / "in.npz"))
    assert missing.returncode == 2 and "edgetest::soft_clip" in missing.stderr
    result = cli("run", str(out), "--inputs", str(tmp_path / "in.npz"), "--out",
                 str(tmp_path / "out.npz"), "--preload", "tests/models/custom_op.py")
    assert result.returncode == 0, result.stderr
    assert "providers used: CPUExecutionProvider" in result.stderr  # never silent
    from tests.models.custom_op import factory
    model, _, _ = factory()
    with np.load(tmp_path / "out.npz") as got:
        np.testing.assert_allclose(got["output"], model(torch.from_numpy(x)).detach().numpy(),
                                   rtol=1e-4, atol=1e-5)


def test_fallback_forbid_names_every_unsupported_op(cli_here, tmp_path):
    out = tmp_path / "forbid.artifact"
    result = cli_here("build", CUSTOM, "--target", "onnx", "--fallback", "forbid", "--out",
                      str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "edgetest.soft_clip.default" in result.stderr and "custom_op.py:26" in result.stderr
    assert not out.exists()


def test_dry_run_tables_placement_without_compiling(cli_here, tmp_path):
    out = tmp_path / "dry.artifact"
    result = cli_here("build", CUSTOM, "--target", "onnx", "--dry-run", "--json", "--out", str(out))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["placement"]["partitions"] == 3 and data["placement"]["device_transfers"] == 0
    assert {r["backend"] for r in data["coverage"]} == {"onnxruntime", "torch"}
    assert all(r["reason"] for r in data["coverage"])
    assert not out.exists()
    small = cli_here("build", CUSTOM, "--target", "onnx", "--dry-run", "--json",
                     "--min-partition-size", "3")
    placement = json.loads(small.stdout)["placement"]
    assert placement["delegated_partitions"] == 0, "islands under 3 ops stay on the CPU"


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_builds_and_runs_on_onnx_with_dynamic_batch(name, artifacts_dir, cli_here):
    out = artifacts_dir / f"zoo-{name}-onnx.artifact"
    result = cli_here("build", f"zoo:{name}", "--target", "onnx", "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["validation"]["passed"] is True
    assert_zoo_artifact_matches_eager(out, name)
    manifest = runtime.read_manifest(out)
    plan = manifest.memory_plan  # what `exporter inspect --json` shows
    assert plan["lower_bound_bytes"] <= plan["arena_bytes"] <= 1.05 * plan["lower_bound_bytes"]
    fused = {r["name"]: r["info"] for r in manifest.passes if r["modified"]}
    if name in ("cnn", "cnn-trained"):
        assert fused["fold_batchnorm"]["batchnorms_folded"] == 6
    if name in ("encoder", "decoder"):
        assert fused["remove_noops"]["constants_folded"] == 1  # the position-table slice


def test_hf_model_on_onnx_with_dynamic_batch(artifacts_dir, cli_here):
    pytest.importorskip("transformers")
    out = artifacts_dir / "bert-onnx.artifact"
    result = cli_here("build", "tests/models/hf_bert.py:tiny_bert", "--target", "onnx", "--out",
                      str(out), "--json", "--dynamic", "input_ids:0=1..8",
                      "--dynamic", "attention_mask:0=1..8")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["validation"]["passed"] is True
    merged = {r["name"]: r["info"] for r in runtime.read_manifest(out).passes}
    assert merged["merge_parallel_linears"] == {"linears_merged": 6, "groups": 2}  # Q, K, V
    from tests.models.hf_bert import tiny_bert
    model, _ = tiny_bert()
    ids = torch.randint(0, 128, (7, 12))
    mask = torch.ones(7, 12, dtype=torch.int64)
    got = runtime.load(out).run({"input_ids": ids, "attention_mask": mask})
    expected = model(ids, mask)
    torch.testing.assert_close(got["last_hidden_state"], expected.last_hidden_state,
                               rtol=1e-4, atol=1e-4)


def test_bench_measures_overhead_over_plain_onnxruntime(artifacts_dir, cli_here):
    out = artifacts_dir / "zoo-cnn-onnx.artifact"
    if not out.exists():
        pytest.skip("built by the zoo test")
    result = cli_here("bench", str(out), "--baseline", "onnxruntime", "--runs", "500", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    ratio = data["ratios"]["artifact/onnxruntime"]
    assert 0.5 < ratio < 2.0  # wide: CI timing is noisy; the speed goal is checked by bench/


def test_no_fuse_leaves_the_fusion_passes_out(cli_here, tmp_path):
    out = tmp_path / "cnn-unfused.artifact"
    result = cli_here("build", "zoo:cnn", "--target", "onnx", "--no-fuse", "--out", str(out))
    assert result.returncode == 0, result.stderr
    # no fusion pass; torch.onnx's own decomposition (and the casts and copies it needs
    # around it) still run, as torch.onnx.export would run them anyway
    assert [r["name"] for r in runtime.read_manifest(out).passes] == [
        "shape_mutations_as_views", "eliminate_dead_code", "global_average_pool",
        "cast_before_rsub", "decompose", "contiguous_before_reshape"]


def test_fallback_partition_runs_in_the_planned_arena(cli_here, tmp_path):
    """Everything on the CPU fallback (islands under 3 ops): its intermediates are planned
    into the runtime's CPU arena, and the measured peak is recorded beside the plan."""
    out = tmp_path / "arena.artifact"
    result = cli_here("build", CUSTOM, "--target", "onnx", "--min-partition-size", "3",
                      "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    manifest = runtime.read_manifest(out)
    arena = manifest.memory_plan["arenas"]["cpu"]
    measured = json.loads(result.stdout)["measured"]["memory"]
    assert sorted(arena["slots"]) == ["p0/linear", "p0/relu"]  # soft_clip has no out=
    assert arena["arena_bytes"] == arena["lower_bound_bytes"] == 4096  # 16 x 32 floats, 2x
    assert measured["cpu_peak_bytes"] > 0
    import tests.models.custom_op as custom  # registers edgetest::soft_clip here
    program = runtime.load(out)
    assert program.memory_report["cpu"]["fallback_slots_in_use"] == 2
    model, _, _ = custom.factory()
    for batch in (1, 16, 7):
        x = torch.randn(batch, 16)
        torch.testing.assert_close(program(x), model(x), rtol=0, atol=0)
    shown = cli_here("inspect", str(out))
    assert "runtime arena on cpu: 0.004 MB preallocated for 2 CPU-fallback" in shown.stdout


def test_memory_budget_fails_the_build_with_the_figures(cli_here, tmp_path):
    out = tmp_path / "budget.artifact"
    tight = cli_here("build", "zoo:encoder", "--target", "onnx", "--memory-budget", "1MB",
                     "--out", str(out))
    assert tight.returncode == 1 and "Traceback" not in tight.stderr
    assert "over the --memory-budget of 1.00 MB" in tight.stderr
    assert "weights: 0.49 MB" in tight.stderr and "activations (arena" in tight.stderr
    assert not out.exists()
    roomy = cli_here("build", "zoo:encoder", "--target", "onnx", "--memory-budget", "8MiB",
                     "--dry-run")
    assert roomy.returncode == 0, roomy.stderr
    bad = cli_here("build", "zoo:encoder", "--target", "onnx", "--memory-budget", "lots")
    assert bad.returncode == 2 and "'lots' is not a size" in bad.stderr


def test_inspect_plots_the_memory_plan(custom_onnx, cli_here, tmp_path):
    out, _ = custom_onnx
    png = tmp_path / "plan.png"
    result = cli_here("inspect", str(out), "--plot", str(png))
    assert result.returncode == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert list(tmp_path.iterdir()) == [png], "no partial file left beside it"
    missing = cli_here("inspect", str(out), "--plot", str(tmp_path / "no" / "plan.png"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr


class _EpsilonDenominator(torch.nn.Module):
    """A router's normalization: weights / (their sum + 1e-20), as AFMoE and DeepSeek
    routers write it; all-zero weights (scores that underflowed) must give 0, not NaN."""

    def forward(self, weights):
        return weights / (weights.sum(-1, keepdim=True) + 1e-20)


def test_tiny_epsilons_survive_the_onnx_optimizer(tmp_path):
    """torch.onnx's optimizer took ``x + 1e-20`` for ``x + 0`` and dropped it
    (targets/onnx/torch_onnx.py exact_no_op_rules): an AFMoE build generated NaN logits."""
    import exporter
    import runtime
    zeros = torch.zeros(3, 4)
    built = exporter.build(_EpsilonDenominator(), (zeros,), target="onnx",
                           out=tmp_path / "eps.artifact")
    got = runtime.load(built.artifact)(zeros)
    assert torch.equal(got, torch.zeros(3, 4))


def test_an_op_outside_aten_that_returns_a_view_is_placed_on_the_fallback():
    """torch.onnx cannot functionalize prims.broadcast_in_dim (its own decomposition of
    torch.std, in Gemma 3n's activation sparsity, before targets/onnx/variance.py): claimed by onnx, it failed its whole partition and
    907 ops moved to the CPU fallback. Now that op alone is placed there."""
    from targets import get_target
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    node = graph.call_function(torch.ops.prims.broadcast_in_dim.default, (x, [2, 3], [1]))
    support = get_target("onnx").supports(node)
    assert not support.ok and "returns a view" in support.reason
    add = graph.call_function(torch.ops.aten.add.Tensor, (x, x))
    assert get_target("onnx").supports(add).ok


class _Standardize(torch.nn.Module):
    """Gemma 3n's activation sparsity: a threshold from Normal(0, 1).icdf of a constant
    (erf_inv, which ONNX has no op for) and a std over the last dim (torch.onnx's own
    decomposition leaves a prims view it cannot functionalize)."""

    def forward(self, x):
        threshold = torch.distributions.normal.Normal(0, 1).icdf(torch.tensor(0.95))
        mean, std = x.mean(-1, keepdim=True), torch.std(x, dim=-1, keepdim=True, unbiased=False)
        var, mid = torch.var_mean(x, dim=(0, 1), correction=1)
        return torch.relu(x - (mean + std * threshold)), var + mid, x.std()


def test_std_and_a_constant_icdf_run_whole_in_onnx_runtime(tmp_path):
    """Both ran on the CPU fallback (2 ops a program for Gemma 3n); the constant is folded
    at build time (passes/cleanup/remove_noops.py) and variance is plain aten ops."""
    import exporter
    built = exporter.build(_Standardize(), (torch.randn(2, 5, 8),), target="onnx",
                           dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},),
                           out=tmp_path / "std.artifact")
    placement = {p.backend for p in built.manifest.partitions}
    assert placement == {"onnxruntime"} and built.manifest.validation["passed"]


def test_torch_onnx_export_leaves_no_torch_future_warning(tmp_path):
    """torch.onnx decomposes the program itself, and torch 2.13 warns there about its own
    LeafSpec check (once per onnx build, through the Python API)."""
    import warnings

    from targets.onnx.torch_onnx import quiet_registry
    program = torch.export.export(torch.nn.Linear(4, 2), (torch.randn(2, 4),))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_registry():
            torch.onnx.export(program, (), dynamo=True, verbose=False)
    assert not [w for w in caught if issubclass(w.category, FutureWarning)]


class _OneMinusMask(torch.nn.Module):
    """XLNet's ``input_mask = 1.0 - attention_mask``: an int64 mask, a float32 result."""

    def forward(self, x, mask):
        return x * (1.0 - mask)[..., None]


def test_a_number_minus_an_integer_mask_runs_whole_in_onnx_runtime(tmp_path):
    """torch.onnx decomposes ``1.0 - mask`` to ``sub(1.0, mask)`` and has no translation
    for a float and an int64 tensor: the op went to the CPU fallback, and the artifact
    needed torch for it (targets/onnx/passes/cast_before_rsub.py casts the mask first)."""
    import exporter
    mask = torch.tensor([[1, 1, 0, 1]])
    built = exporter.build(_OneMinusMask(), (torch.randn(1, 4, 3), mask), target="onnx",
                           out=tmp_path / "mask.artifact")
    placement = [p.backend for p in built.manifest.partitions]
    assert placement == ["onnxruntime"] and built.manifest.validation["passed"]
    x = torch.randn(1, 4, 3)
    assert torch.equal(runtime.load(built.artifact)(x, mask), x * (1.0 - mask)[..., None])
