"""Target executorch end to end through the CLI: the zoo MLP and CNN with a dynamic batch
(run at both ends of its range), the dry run's per-op placement (XNNPACK delegate or
ExecuTorch kernel, with the reason), ops ExecuTorch has no kernel for on the CPU
fallback (and listed under --fallback forbid), a .pte ExecuTorch refuses, and --quantize
(int8-static, int8-dynamic) through the labelled gate with the int8 ops in XNNPACK
(int4-weight and embedding tables: test_executorch_quantize.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import runtime
from runtime.format.archive import ArtifactReader
from exporter.model.zoo import ZOO
from exporter.ship.archive_writer import write_artifact
from exporter.validation.gates import compare_quantized
from runtime.errors import ArtifactError
from tests.conftest import ROOT
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
def zoo_built(artifacts_dir, cli_here):
    """zoo name -> its executorch artifact, built once for this module."""
    built = {}

    def get(name: str):
        if name not in built:
            out = artifacts_dir / f"zoo-{name}-executorch.artifact"
            _build(cli_here, out, f"zoo:{name}")
            built[name] = out
        return built[name]
    return get


# cnn: make test-slow; convolutions in XNNPACK run in make test at int8 (below) and in the
# native RegNetY bundle (tests/native/test_executorch_native.py)
@pytest.mark.parametrize("name", ["mlp", pytest.param("cnn", marks=pytest.mark.slow)])
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


def test_running_a_pte_imports_executorchs_pybinding_not_its_exporter(zoo_built):
    """executorch.runtime imports executorch.exir (7 CPU s: torch._inductor, the edge
    dialect): a process that only runs a .pte, as every validation child does, must not."""
    probe = ("import sys, torch, runtime; out = runtime.load(sys.argv[1])(torch.ones(3, 64));"
             "print(tuple(out.shape), sorted(m for m in sys.modules if 'executorch.exir' in m))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", probe, str(zoo_built("mlp"))], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "(3, 10) []"


def test_loading_a_pte_leaves_no_cpu_probing_lines_on_stderr(zoo_built):
    """ExecuTorch logs its CPU probing when its thread pool starts, at the first program's
    load ("[cpuinfo_utils.cpp:71] Reading file ...": 5 lines before every `exporter run`)."""
    probe = "import sys, torch, runtime; runtime.load(sys.argv[1])(torch.ones(3, 64))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", probe, str(zoo_built("mlp"))], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "cpuinfo_utils" not in done.stderr, done.stderr[-2000:]


def test_dry_run_says_per_op_whether_xnnpack_or_an_executorch_kernel_runs_it(cli_here):
    result = cli_here("build", "zoo:cnn", "--target", "executorch", "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["op"]: row for row in json.loads(result.stdout)["coverage"]}
    assert rows["aten.convolution.default"]["reason"] == "XNNPACK delegate (ConvolutionConfig)"
    # a reshape by the dynamic batch: XNNPACK's config refuses it, a kernel runs it
    assert rows["aten.view.default"]["reason"].startswith("portable kernel aten::view_copy.out")
    assert {row["backend"] for row in rows.values()} == {"executorch"}


def test_an_op_executorch_has_no_kernel_for_runs_on_the_cpu_fallback(artifacts_dir, cli_here):
    out = artifacts_dir / "gaps-executorch.artifact"
    _build(cli_here, out, f"{GAPS}:factory")
    manifest = runtime.read_manifest(out)
    assert [p.backend for p in manifest.partitions] == ["executorch", "torch", "executorch"]
    (row,) = [r for r in manifest.coverage if r["backend"] == "torch"]
    assert row["op"] == "aten.i0.default" and "no ExecuTorch kernel" in row["reason"]
    from tests.models.executorch_gaps import factory
    module, _, _ = factory()
    batch = torch.randn(16, 16)
    torch.testing.assert_close(runtime.load(out)(batch), module(batch), rtol=1e-4, atol=1e-4)


def test_fallback_forbid_lists_every_op_executorch_cannot_run(cli_here, tmp_path):
    out = tmp_path / "forbid.artifact"
    result = cli_here("build", f"{GAPS}:two_factory", "--target", "executorch",
                      "--fallback", "forbid", "--out", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "aten.i0.default" in result.stderr and "aten.logcumsumexp.default" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("program", [b"", b"ET12" + b"\x00" * 60, b"\x1c\x00\x00\x00ET12" * 40],
                         ids=["empty", "header-only", "garbage"])
def test_a_pte_executorch_refuses_is_a_bad_artifact_not_a_crash(zoo_built, tmp_path, cli_here,
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
    # refused in this process above: the command's own process would prove nothing more
    result = cli_here("run", str(bad), "--inputs", str(tmp_path / "in.npz"))
    assert result.returncode == 2 and "Traceback" not in result.stderr


# --quantize: PT2E with ExecuTorch's XNNPACKQuantizer; the q/dq nodes must land inside the
# XNNPACK delegate with the op they quantize (else the .pte calls ExecuTorch's slow
# quantized_decomposed kernels around a float op).
# Quantized layers: the MLP's 3 linears; the CNN's 6 convs + head (static), and dynamic
# only its linear head (int8-dynamic keeps convolutions float: test_executorch_int8_recipes).
QUANTIZED = {("mlp", "int8-static"): 3, ("mlp", "int8-dynamic"): 3,
             ("cnn", "int8-static"): 7, ("cnn", "int8-dynamic"): 1}


@pytest.fixture(scope="module")
def quantized_built(artifacts_dir, cli_here):
    """(zoo name, recipe) -> its quantized executorch artifact, built once."""
    built = {}

    def get(name: str, recipe: str):
        if (name, recipe) not in built:
            out = artifacts_dir / f"zoo-{name}-executorch-{recipe}.artifact"
            extra = []
            if recipe == "int8-static":
                _, (example,), _ = ZOO[name]()
                calibration = artifacts_dir / f"{name}-calibration.npz"
                np.savez(calibration, **{"x" if name == "mlp" else "image":
                                         torch.randn(8, *example.shape[1:]).numpy()})
                extra = ["--calibration", str(calibration)]
            _build(cli_here, out, f"zoo:{name}", "--quantize", recipe, *extra)
            built[name, recipe] = out
        return built[name, recipe]
    return get


@pytest.mark.parametrize("name, recipe", [
    ("mlp", "int8-dynamic"), ("cnn", "int8-static"),
    pytest.param("mlp", "int8-static", marks=pytest.mark.slow),
    pytest.param("cnn", "int8-dynamic", marks=pytest.mark.slow)])
def test_quantized_model_passes_its_labelled_gate_with_int8_ops_inside_xnnpack(
        quantized_built, name, recipe):
    out = quantized_built(name, recipe)
    manifest = runtime.read_manifest(out)
    validation = manifest.validation
    assert validation["passed"] and validation["policy"].startswith("quantized build")
    assert all(row["criterion"] == "quantized" for row in validation["outputs"])
    (info,) = [r["info"] for r in manifest.passes if r["name"] == "quantize"]
    assert info["recipe"] == recipe and "XNNPACKQuantizer" in info["how"]
    assert len(info["layers_quantized"]) == QUANTIZED[name, recipe]
    (partition,) = manifest.partitions
    placement = partition.meta["placement"]
    quant_ops = {op: row for op, row in placement.items() if op.startswith("quantized_decomposed")}
    # the weights' dequantize (one per quantized layer) and the activations' q/dq: XNNPACK's
    weights = placement["quantized_decomposed.dequantize_per_channel.default"]
    assert weights == {"XNNPACK": QUANTIZED[name, recipe]}
    assert any(op.startswith("quantized_decomposed.quantize_per_tensor") for op in quant_ops)
    assert all(set(row) == {"XNNPACK"} for row in quant_ops.values())
    assert not any(k.startswith("quantized_decomposed") for k in partition.meta["kernels"])
    # the loaded artifact at a batch validation did not use, against eager float32
    module, (example,), _ = ZOO[name]()
    batch = torch.randn(5, *example.shape[1:])
    with torch.no_grad():
        row = compare_quantized(runtime.load(out)(batch), module(batch), 20.0, 0.99)
    assert row["passed"], row


def test_dry_run_places_quantize_nodes_in_xnnpack_with_the_op_they_feed(cli_here):
    result = cli_here("build", "zoo:mlp", "--target", "executorch", "--quantize", "int8-dynamic",
                      "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["coverage"]
    quant = [row for row in rows if row["op"].startswith("quantized_decomposed")]
    assert quant and all(row["backend"] == "executorch" for row in quant)
    assert {row["reason"] for row in quant} == {
        "XNNPACK delegate (an operand of LinearConfig's quantized pattern)"}


def test_a_recipe_executorch_does_not_run_is_a_usage_error_naming_its_recipes(cli_here, tmp_path):
    out = tmp_path / "x.artifact"
    result = cli_here("build", "zoo:mlp", "--target", "executorch", "--quantize", "int8-weight",
                      "--out", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "executorch: int8-static, int8-dynamic, int4-weight" in result.stderr
    assert not out.exists()


def test_quantize_nodes_outside_xnnpack_run_on_executorch_quantized_kernels(
        quantized_built, tmp_path, cli_here):
    """A .pte whose q/dq are ExecuTorch's quantized_decomposed kernels (no delegate) runs
    from a fresh process: the executor registers those kernels before loading it."""
    import executorch.kernels.quantized  # noqa: F401 - the emitter needs their out variants
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer, get_symmetric_quantization_config)
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    x = torch.randn(2, 64)
    layer = torch.nn.Linear(64, 10).eval()
    prepared = prepare_pt2e(torch.export.export(layer, (x,)).module(), XNNPACKQuantizer()
                            .set_global(get_symmetric_quantization_config(is_per_channel=True)))
    prepared(x)
    program = to_edge_transform_and_lower(
        torch.export.export(convert_pt2e(prepared), (x,))).to_executorch()
    kernels = [o.name for o in program.executorch_program.execution_plan[0].operators]
    assert "quantized_decomposed::dequantize_per_channel" in kernels
    with ArtifactReader.open(quantized_built("mlp", "int8-dynamic")) as reader:
        manifest = json.loads(json.dumps(reader.manifest))
        entries = {name: reader.read_bytes(name) for name in reader.names()
                   if name != "manifest.json"}
    (entry,) = [name for name in entries if name.endswith(".pte")]
    entries[entry] = program.buffer
    manifest["partitions"][0]["meta"]["kernels"] = kernels
    artifact = write_artifact(tmp_path / "kernels.artifact", manifest, entries)
    np.savez(tmp_path / "in.npz", x=x.numpy())
    result = cli_here("run", str(artifact), "--inputs", str(tmp_path / "in.npz"),
                      "--out", str(tmp_path / "out.npz"))
    assert result.returncode == 0, result.stderr
    (got,) = np.load(tmp_path / "out.npz").values()
    with torch.no_grad():
        assert compare_quantized(torch.from_numpy(got), layer(x), 20.0, 0.99)["passed"]


def test_inspect_and_report_show_executorch_delegation_and_its_arenas_beside_our_plan(
        zoo_built, cli_here, tmp_path):
    """ExecuTorch's placement (XNNPACK delegates, its own kernels) and the arenas its
    memory planning sized for the batch's upper bound were in the meta only."""
    out = zoo_built("mlp")
    meta = runtime.read_manifest(out).partitions[0].meta
    shown = cli_here("inspect", str(out))
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert (f"inside p0: {meta['xnnpack_ops']} op(s) in {meta['delegates']} XNNPACK "
            f"delegate(s), {meta['portable_ops']} on ExecuTorch's own kernels") in text
    assert (f"ExecuTorch's own arenas in p0: {meta['planned_bytes'] / 1e6:.3f} MB") in text
    assert "in 1..32" in text.split("own arenas in p0")[1]
    assert "the lower bound" in text  # our plan's, on the line above
    page = tmp_path / "report.html"
    assert cli_here("report", str(out), "--html", str(page)).returncode == 0
    html = page.read_text()
    assert "inside p0: " in html and "own arenas in p0" in html
