"""executorch --quantize beyond the PT2E int8 recipes: int4-weight as ExecuTorch's 8da4w
(torchao's Int8DynamicActivationIntxWeightConfig, groups of 32, inside XNNPACK), int8
embedding tables as ExecuTorch's embedding_byte kernel (a Hugging Face BERT at fp32 and
int8), and the module that registers a Library-defined op (torchao's) for a CPU-fallback
partition that calls it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import runtime
from exporter.validation.gates import compare_quantized

pytest.importorskip("executorch")
GAPS = "tests/models/executorch_gaps.py"
BERT = "tests/models/hf_bert.py:tiny_bert"


def _build(cli, out, spec, *extra):
    result = cli("build", spec, "--target", "executorch", "--out", str(out), "--json", *extra)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["validation"]["passed"] is True
    return runtime.read_manifest(out)


@pytest.fixture(scope="module")
def int4_mixer(artifacts_dir, cli_here):
    """Built in process: its validation is still a process of its own, which must import
    torchao's ops for the artifact (the reason this build once failed)."""
    out = artifacts_dir / "token-mixer-executorch-int4.artifact"
    return out, _build(cli_here, out, f"{GAPS}:token_mixer", "--quantize", "int4-weight")


def test_int4_weight_runs_8da4w_linears_inside_xnnpack_and_says_why_one_stays_float(
        int4_mixer):
    out, manifest = int4_mixer
    assert manifest.validation["policy"].startswith("quantized build")
    (info,) = [r["info"] for r in manifest.passes if r["name"] == "quantize"]
    assert "Int8DynamicActivationIntxWeightConfig" in info["how"]
    assert info["layers_quantized"] == ["table:embedding", "wide:linear"]
    (narrow,) = info["layers_float"]  # 40 in-features: no group of 32 divides them
    assert narrow["layer"].startswith("narrow") and "not a multiple of the int4 group (32" \
        in narrow["why"]
    (partition,) = manifest.partitions  # nothing on the CPU fallback
    placement = partition.meta["placement"]
    torchao = {op: row for op, row in placement.items() if op.startswith("torchao.")}
    # the activations' choose_qparams/quantize/dequantize and the weights' dequantize
    assert set(torchao) == {"torchao.choose_qparams_affine.default",
                            "torchao.quantize_affine.default",
                            "torchao.dequantize_affine.default"}
    assert all(set(row) == {"XNNPACK"} for row in torchao.values())
    assert placement["aten.linear.default"] == {"XNNPACK": 2}
    from tests.models.executorch_gaps import token_mixer
    module, _, _ = token_mixer()
    ids = torch.randint(0, 50, (7, 6))
    with torch.no_grad():
        row = compare_quantized(runtime.load(out)(ids), module(ids), 20.0, 0.99)
    assert row["passed"], row


def test_an_int8_embedding_table_gathers_rows_with_executorch_embedding_byte(int4_mixer):
    """torchao's dequantize_affine of a table has no ExecuTorch kernel: it ran on the CPU
    fallback, dequantizing the whole table each call. It is ExecuTorch's quantized
    gather now, in the one .pte."""
    _, manifest = int4_mixer
    (partition,) = manifest.partitions
    assert partition.meta["placement"]["quantized_decomposed.embedding_byte.default"] == {
        "portable": 1}
    assert "quantized_decomposed::embedding_byte.out" in partition.meta["kernels"]
    assert "aten.embedding.default" not in partition.meta["placement"]
    (record,) = [r for r in manifest.passes if r["name"] == "embedding_byte"]
    assert record["info"]["tables"] == 1


# make test-slow: int8 tables inside the .pte run in make test on int4_mixer above, and a
# Hugging Face model on executorch in tests/native/test_executorch_native.py
@pytest.mark.parametrize("recipe", [
    pytest.param("int8-dynamic", marks=pytest.mark.slow),
    pytest.param("fp32", marks=pytest.mark.slow),
    pytest.param("int8-static", marks=pytest.mark.slow)])
def test_hugging_face_bert_builds_and_validates_with_its_tables_inside_executorch(
        tmp_path, cli, recipe):
    """BERT int8 failed validation: its int8 word/position/type tables' dequantize ran
    on the CPU fallback, whose torchao op the validation process had not registered."""
    out = tmp_path / f"bert-{recipe}.artifact"
    extra = []
    if recipe != "fp32":
        extra = ["--quantize", recipe]
    if recipe == "int8-static":
        calibration = tmp_path / "calibration.npz"
        np.savez(calibration, input_ids=np.random.default_rng(0).integers(0, 128, (2, 12)),
                 attention_mask=np.ones((2, 12), np.int64))
        extra += ["--calibration", str(calibration)]
    manifest = _build(cli, out, BERT, *extra)
    assert [p.backend for p in manifest.partitions] == ["executorch"]
    kernels = manifest.partitions[0].meta["kernels"]
    quantized = "quantized_decomposed::embedding_byte.out" in kernels
    assert quantized == (recipe != "fp32")
    from tests.models.hf_bert import tiny_bert
    model, _ = tiny_bert()
    ids, mask = torch.randint(0, 128, (2, 12)), torch.ones(2, 12, dtype=torch.int64)
    with torch.no_grad():
        got = runtime.load(out)(ids, mask)["last_hidden_state"]
        want = model(ids, mask).last_hidden_state
    if recipe == "fp32":
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    else:
        assert compare_quantized(got, want, 20.0, 0.99)["passed"]


def test_a_library_defined_op_names_the_installed_module_that_registers_it():
    """A CPU-fallback partition calling torchao's ops (defined by a torch.library.Library,
    not torch.library.custom_op) recorded no module, so the validation process never
    imported torchao and refused the artifact. The dispatcher's record of where the op
    was defined names it now; an op of a file that is not installed still names none."""
    import torchao  # noqa: F401 - registers its ops

    from exporter.builder.preload import defining_module
    assert defining_module("torchao.dequantize_affine") == "torchao.quantization.quant_primitives"
    assert defining_module("torchao.choose_qparams_affine") == \
        "torchao.quantization.quant_primitives"
    library = torch.library.Library("executorch_test_ns", "FRAGMENT")
    library.define("twice(Tensor x) -> Tensor")
    assert defining_module("executorch_test_ns.twice") is None  # this test file's own
    assert defining_module("executorch_test_ns.missing") is None
