"""What real architectures do and the toolchain once failed on (the coverage issue):
stock PyTorch attention on onnx and tvm, an op torch.onnx decomposes into one it cannot
translate, a higher-order op inside a partitioned program, keyword inputs from a factory,
and source lines that survive the fusion passes."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

from exporter.builder.pipeline import prepare, stage_timer
from exporter.settings import BuildSettings
from plan.partition import materialize

pytest.importorskip("onnxruntime")
MODELS = "tests/models/real_world.py"


@pytest.mark.parametrize("factory, target", [
    ("stock_mha", "onnx"), ("stock_encoder", "onnx"),
    pytest.param("stock_mha", "tvm", marks=pytest.mark.slow)])
def test_stock_pytorch_attention_builds_and_validates(cli_here, tmp_path, factory, target):
    if target == "tvm":
        pytest.importorskip("tvm")
    out = tmp_path / f"{factory}.artifact"
    result = cli_here("build", f"{MODELS}:{factory}", "--target", target, "--out", str(out),
                      "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["validation"]["passed"] is True
    assert data["placement"]["by_backend"].get("torch@cpu", 0) == 0, "all of it delegated"
    assert not any("skipped" in w for w in data["warnings"]), data["warnings"]


@pytest.mark.slow  # a large model captured twice; test_onnx_target's dry run covers the table
def test_dry_run_places_what_the_onnx_exporter_cannot_translate_on_the_cpu(cli_here, tmp_path):
    """special_i0 decomposes to prims.bessel_i0 inside torch.onnx: placement judges the
    decomposed graph, so the dry run, the build and --fallback forbid agree."""
    dry = cli_here("build", f"{MODELS}:bessel", "--target", "onnx", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    fallback = [r for r in json.loads(dry.stdout)["coverage"] if r["backend"] == "torch"]
    assert [r["op"] for r in fallback] == ["prims.bessel_i0.default"]
    assert "real_world.py" in fallback[0]["source"]
    built = cli_here("build", f"{MODELS}:bessel", "--target", "onnx", "--out",
                     str(tmp_path / "b.artifact"), "--json")
    assert built.returncode == 0 and json.loads(built.stdout)["validation"]["passed"] is True
    forbid = cli_here("build", f"{MODELS}:bessel", "--target", "onnx", "--fallback", "forbid",
                      "--out", str(tmp_path / "f.artifact"))
    assert forbid.returncode == 2 and "prims.bessel_i0" in forbid.stderr
    assert "Traceback" not in forbid.stderr


def test_partition_carries_the_body_of_a_higher_order_op():
    """A @torch.no_grad() helper is a wrap_with_set_grad_enabled node reading a subgraph
    attribute; cut into partitions (a Python custom op forces a CPU fallback on 'cpu'),
    the subgraph is copied into the partition, not taken as a run-time input."""
    prep = prepare(f"{MODELS}:no_grad_rotary", BuildSettings(target="cpu", out="x.artifact"),
                   stage_timer({}, lambda name: contextlib.nullcontext()))
    assert torch.is_grad_enabled(), "the op costs ran the higher-order op and left grad off"
    assert any("set_grad" in str(n.target) for n in prep.program.graph.nodes)
    plans = prep.placement.plans
    assert [p.delegated for p in plans] == [True, False, True]
    materialize(prep.program, plans, ["x"], ["output"], prep.captured.inputs.tensors)
    x = prep.captured.inputs.tensors[0]
    (h,) = plans[0].program.module()(x)
    (scaled,) = plans[1].program.module()(h)
    (out,) = plans[2].program.module()(scaled)
    torch.testing.assert_close(out, prep.model.module(x))


def test_factory_keyword_inputs_keep_their_names(cli_here, tmp_path):
    result = cli_here("build", f"{MODELS}:keyword_only", "--target", "onnx", "--out",
                      str(tmp_path / "k.artifact"), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [t["name"] for t in data["signature"]["inputs"]] == ["input_ids", "attention_mask"]
    assert [t["name"] for t in data["signature"]["outputs"]] == ["logits"]
    assert data["validation"]["passed"] is True


def test_fused_program_keeps_the_models_source_lines(cli_here):
    """The fusion passes re-capture the program; each op still cites the model's line."""
    result = cli_here("build", "zoo:encoder", "--target", "onnx", "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    sources = [r["source"] or "" for r in data["coverage"]]
    assert not any("eval_with_key" in s for s in sources), sources[:5]
    assert sum("zoo.py" in s for s in sources) > len(sources) // 2
