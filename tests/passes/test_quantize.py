"""--quantize on target cpu (torchao PT2E + AOTInductor) through the CLI: the recipes,
what the manifest reports, the accuracy gate, and the bad inputs (recipe a target
cannot run, int8-static without calibration)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import runtime
from exporter.validation.gates import compare_quantized
from exporter.report.console import quantization_records
from exporter.model.zoo import ZOO

pytest.importorskip("torchao")


def _quantize_record(path):
    manifest = runtime.read_manifest(path)
    (info,) = quantization_records(manifest)
    return manifest, info


def _linears_and_embeddings(name):
    modules = list(ZOO[name]()[0].modules())
    return (sum(isinstance(m, torch.nn.Linear) for m in modules),
            sum(isinstance(m, torch.nn.Embedding) for m in modules))


# The int8-activation gate tests of the zoo encoder (cpu and onnx) and of the trained CNN
# assert the gate (their history: docs/design-notes.md); their builds are slow, so they
# run in `make test-slow`, not `make test`.


@pytest.mark.parametrize("recipe", [pytest.param("int8-dynamic", marks=pytest.mark.slow),
                                    "int8-weight"])
def test_encoder_quantizes_every_linear_and_embedding_and_passes_the_gate(
        artifacts_dir, cli_here, recipe):
    out = artifacts_dir / f"encoder-{recipe}.artifact"
    result = cli_here("build", "zoo:encoder", "--target", "cpu", "--quantize", recipe,
                      "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    manifest, info = _quantize_record(out)
    linears, embeddings = _linears_and_embeddings("encoder")
    # a plain fp32 library folds int8-weight's linears' dequantizes, not the int8 tables'
    # (targets/aoti/folded_weights.py)
    stored_float = [w for w in json.loads(result.stdout)["warnings"] if "stored as float" in w]
    assert bool(stored_float) == (recipe == "int8-weight"), stored_float
    assert (linears, embeddings) == (9, 1)
    assert len(info["layers_quantized"]) == linears + embeddings and info["layers_float"] == []
    # what stays float: position table, layer norms, biases
    assert info["weight_bytes_after"] * 3.2 < info["weight_bytes_before"]
    program = runtime.load(out)
    ids = torch.randint(0, 100, (3, 16))
    with torch.no_grad():
        eager = ZOO["encoder"]()[0](ids, torch.ones_like(ids))["pooled"]
    assert compare_quantized(program(ids, torch.ones_like(ids))["pooled"], eager,
                             20.0, 0.99)["passed"]  # the loaded artifact, at a new batch size
    validation = manifest.validation
    assert validation["passed"] and validation["policy"].startswith("quantized build")
    assert all(row["criterion"] == "quantized" and row["sqnr_db"] >= 20
               for row in validation["outputs"])


def test_int8_static_cnn_with_calibration_file(artifacts_dir, cli_here, tmp_path):
    _, (image,), _ = ZOO["cnn"]()
    calibration = tmp_path / "calibration.npz"
    np.savez(calibration, image=torch.randn(8, *image.shape[1:]).numpy())
    out = artifacts_dir / "cnn-int8-static.artifact"
    result = cli_here("build", "zoo:cnn", "--target", "cpu", "--quantize", "int8-static",
                      "--calibration", str(calibration), "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    manifest, info = _quantize_record(out)
    assert info["calibration_sets"] == 1 and len(info["layers_quantized"]) == 7  # 6 convs + head
    assert info["weight_bytes_after"] * 3.5 <= info["weight_bytes_before"]
    (row, *_) = manifest.validation["outputs"]
    assert "top1_agreement" in row  # [batch, classes]: classifier-shaped


def test_missing_the_gate_exits_1_saying_by_how_much(cli_here, tmp_path):
    """The gate, its message and the random-calibration warning are the builder's, the same
    for every target: built for onnx, a fraction of AOTInductor's compile (the cpu target's
    int8-static passing its gate: test_int8_static_cnn_with_calibration_file)."""
    pytest.importorskip("onnxruntime")
    out = tmp_path / "mlp.artifact"
    result = cli_here("build", "zoo:mlp", "--target", "onnx", "--quantize", "int8-static",
                      "--calibration", "random", "--min-sqnr", "200", "--min-cosine", "1.5",
                      "--out", str(out))
    assert result.returncode == 1, result.stderr
    assert "misses the accuracy gate" in result.stderr and "dB short of 200" in result.stderr
    assert "RANDOM inputs" in result.stderr  # the loud calibration warning
    assert not out.exists()


@pytest.mark.parametrize("args, needle", [
    (["--target", "tvm", "--quantize", "int8-dynamic"], "cpu: int8-dynamic, int8-static"),
    (["--target", "tvm", "--quantize", "int4-weight"], "cuda: int8-weight, int4-weight"),
    (["--target", "cpu", "--quantize", "int8-weight", "--calibration", "random"],
     "does not calibrate"),
    (["--target", "cpu", "--quantize", "int8-static"], "needs calibration data"),
    (["--target", "cpu", "--calibration", "random"], "without --quantize"),
    (["--target", "cpu", "--quantize", "int8-dynamic", "--dtype", "fp16"], "--dtype fp16"),
    (["--target", "cpu", "--quantize", "int3"], "--quantize"),
])
def test_bad_quantize_options_are_usage_errors(cli_here, tmp_path, args, needle):
    result = cli_here("build", "zoo:mlp", *args, "--out", str(tmp_path / "x.artifact"))
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr and "Traceback" not in result.stderr


def test_compare_quantized_figures():
    eager = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    row = compare_quantized(eager * 1.01, eager, 20.0, 0.99)
    assert row["passed"] and 39 < row["sqnr_db"] < 41 and row["cosine"] > 0.9999
    assert row["top1_agreement"] == 1.0
    noisy = compare_quantized(eager.flip(1), eager, 20.0, 0.99)
    assert not noisy["passed"] and noisy["top1_agreement"] == 0.0
    assert compare_quantized(torch.arange(3), torch.arange(3), 20, 0.99)["passed"]


@pytest.mark.slow  # a second quantized transformer build; the encoder tests cover the recipes in make test
def test_gpt2_decoder_has_every_linear_quantized(cli_here, tmp_path):
    """HF GPT-2 writes its layers as Conv1D (addmm), which PT2E's quantizer skipped:
    they are rewritten as linears first, so all 8 plus lm_head are int8, and the token
    and position tables too."""
    pytest.importorskip("transformers")
    out = tmp_path / "gpt2.artifact"
    result = cli_here("build", "tests/models/hf_gpt2.py:tiny_gpt2", "--target", "cpu",
                      "--quantize", "int8-dynamic", "--out", str(out))
    assert result.returncode == 0, result.stderr
    _, info = _quantize_record(out)
    assert info["rewritten_as_linear"] == 8 and info["layers_float"] == []
    assert len(info["layers_quantized"]) == 9 + 2
    assert sum(":embedding" in layer for layer in info["layers_quantized"]) == 2


@pytest.mark.slow  # a second quantized transformer build; the encoder tests cover the recipes in make test
def test_dead_pooler_is_cleaned_before_prepare(cli_here, tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "bert.artifact"
    result = cli_here("build", "tests/models/hf_bert.py:tiny_bert_last_hidden_state", "--target",
                      "cpu", "--quantize", "int8-dynamic", "--out", str(out))
    assert result.returncode == 0, result.stderr
    _, info = _quantize_record(out)
    assert not any("pooler" in layer for layer in info["layers_quantized"])


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["int8-dynamic", "int8-static"])
def test_onnx_recipes_use_onnx_runtime_tools(cli_here, tmp_path, recipe):
    pytest.importorskip("onnxruntime")
    out = tmp_path / f"encoder-onnx-{recipe}.artifact"
    extra = ["--calibration", "random"] if recipe == "int8-static" else []
    result = cli_here("build", "zoo:encoder", "--target", "onnx", "--quantize", recipe, *extra,
                      "--out", str(out))
    assert result.returncode == 0, result.stderr
    manifest, info = _quantize_record(out)
    assert info["how"].startswith("ONNX Runtime") and len(info["layers_quantized"]) >= 8
    assert info["weight_bytes_after"] < info["weight_bytes_before"]
    assert manifest.validation["passed"] and manifest.validation["policy"].startswith("quantized")


def test_a_quantizer_failure_stops_the_build_instead_of_running_float(monkeypatch, tmp_path):
    """Moving the partition to the CPU fallback would run it in float and pass the build as
    a quantized one: a quantizer failure stops the build and says what to try instead."""
    import exporter
    import targets.onnx.target as onnx_target
    from targets.errors import LoweringError

    def refuses(*args, **kwargs):
        raise RuntimeError("Unable to find data type for weight_name='linear_1'")
    monkeypatch.setattr(onnx_target, "quantize_model", refuses)
    out = tmp_path / "mlp.artifact"
    with pytest.raises(LoweringError) as caught:
        exporter.build("zoo:mlp", target="onnx", quantize="int8-dynamic", out=out)
    assert not caught.value.movable and not out.exists()
    assert "int8-dynamic quantization failed" in str(caught.value)
    assert "another --quantize recipe" in str(caught.value)  # the hint, set after creation


def test_onnx_weight_only_blocks_follow_quant_block(cli_here, tmp_path):
    """MatMulNBits blocks: 128 weights a scale by default at 4 bits, 256 at 8 (ORT's
    8-bit CPU kernel pays per block), 32 with --quant-block 32 (llama.cpp Q4_0's): the
    graph and the record say which, and the trained encoder passes the quantized gate
    (SQNR >= 20 dB against eager fp32, with margin at both block sizes)."""
    pytest.importorskip("onnxruntime")
    import io
    import zipfile

    import onnx

    from targets.onnx.target import OnnxOptions
    defaults = OnnxOptions()
    assert (defaults.block_for("int4-weight"), defaults.block_for("int8-weight")) == (128, 256)
    assert OnnxOptions(quant_block=32).block_for("int8-weight") == 32
    out = tmp_path / "encoder-int4-32.artifact"
    result = cli_here("build", "zoo:encoder-trained", "--target", "onnx", "--quantize",
                      "int4-weight", "--quant-block", "32", "--out", str(out))
    assert result.returncode == 0, result.stderr
    manifest, info = _quantize_record(out)
    with zipfile.ZipFile(out) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".onnx"))
        model = onnx.load(io.BytesIO(archive.read(name)), load_external_data=False)
    blocks = {onnx.helper.get_attribute_value(a) for node in model.graph.node
              if node.op_type == "MatMulNBits" for a in node.attribute if a.name == "block_size"}
    assert info["block_size"] == 32 and blocks == {32} and manifest.validation["passed"]
    # a wrong block is the user's mistake: exit 2, named, nothing written
    bad = tmp_path / "bad.artifact"
    result = cli_here("build", "zoo:encoder-trained", "--target", "onnx", "--quantize",
                      "int4-weight", "--quant-block", "48", "--out", str(bad))
    assert result.returncode == 2 and "--quant-block" in result.stderr and not bad.exists()


def test_trained_zoo_weights_solve_their_tasks():
    """The shipped weights are trained (not random): what the gate is judged on."""
    from exporter.model.spec import load_spec
    from exporter.model.zoo_trained import cnn_task, encoder_task

    generator = torch.Generator().manual_seed(123)
    images, labels = cnn_task(200, generator)
    cnn = load_spec("zoo:cnn-trained").module
    ids, classes = encoder_task(200, generator)
    with torch.no_grad():
        assert (cnn(images).argmax(1) == labels).float().mean() > 0.95
        pooled = load_spec("zoo:encoder-trained").module(ids, torch.ones_like(ids))["pooled"]
    assert pooled.shape == (200, 64) and torch.isfinite(pooled).all()
    # its head is not shipped: the pooled features of each class sit apart, so the class
    # centroids of half the draws classify the other half
    centroids = torch.stack([pooled[:100][classes[:100] == c].mean(0) for c in range(4)])
    nearest = torch.cdist(pooled[100:], centroids).argmin(1)
    assert (nearest == classes[100:]).float().mean() > 0.9


@pytest.mark.slow
def test_gate_on_a_trained_model_with_task_data(cli_here, tmp_path):
    from exporter.model.zoo_trained import task_inputs

    calibration, validation = tmp_path / "calibration.npz", tmp_path / "validation.npz"
    np.savez(calibration, **{k: v.numpy() for k, v in task_inputs("cnn-trained", 32).items()})
    np.savez(validation, **{k: v.numpy() for k, v in task_inputs("cnn-trained", 32, 3).items()})
    out = tmp_path / "cnn-trained.artifact"
    result = cli_here("build", "zoo:cnn-trained", "--target", "cpu", "--quantize", "int8-static",
                      "--calibration", str(calibration), "--inputs", str(validation),
                      "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["validation"]["outputs"]
    user = next(r for r in rows if r["case"] == "user")
    # int8 keeps the trained CNN at ~40 dB and every prediction (measured 40.7 dB, 100%)
    assert user["sqnr_db"] > 30 and user["top1_agreement"] == 1.0, user


def test_weight_only_reports_each_layer_it_leaves_in_float():
    """int4 groups must divide in_features; a conv is not a weight-only layer. Both stay
    float with the reason (checked before torchao packs anything, so on any machine)."""
    from passes.quantize.quantize_weight_only import QuantizeWeightOnly

    model = torch.nn.Sequential(torch.nn.Conv1d(4, 40, 1), torch.nn.Flatten(),
                                torch.nn.Linear(40 * 3, 8), torch.nn.Linear(8, 40)).eval()
    program = torch.export.export(model, (torch.randn(2, 4, 3),))
    info = QuantizeWeightOnly("int4-weight", "test", "cuda").__call__(program).info
    why = {row["op"]: row["why"] for row in info["layers_float"]}
    assert info["layers_quantized"] == []
    assert "int4-weight quantizes linear layers" in why["conv1d"]
    assert "in_features 8 is not a multiple of an int4 group (128, 64, 32)" in why["linear"]
    # and the build says it among its warnings (--json's too), not only in the summary
    from types import SimpleNamespace

    from exporter.report.console import float_layer_notes
    (note,) = float_layer_notes(SimpleNamespace(passes=[{"name": "quantize", "info": info}],
                                                partitions=[], shared_weights=None,
                                                entry_points=None))
    assert note.startswith("--quantize int4-weight left 3 of 3 weighted layer(s) in float")


def test_inspect_lists_each_entry_points_quantized_weights_and_their_sum_when_not_shared():
    """A cpu int8-dynamic encoder-decoder packs weights into each of its three libraries:
    inspect said only the main program's 2.5x (the file had grown 25% over fp32)."""
    from types import SimpleNamespace

    from exporter.report.console import quantization_lines

    def program(before: int, after: int):
        info = {"recipe": "int8-dynamic", "how": "PT2E", "layers_quantized": ["l"],
                "layers_float": [], "weight_bytes_before": before, "weight_bytes_after": after}
        return SimpleNamespace(passes=[{"name": "quantize", "info": info}], partitions=[])
    main, decode = program(660_000, 270_000), program(660_000, 270_000)
    encode = program(1_050_000, 300_000)
    manifest = SimpleNamespace(passes=main.passes, partitions=[], shared_weights=None,
                               entry_points={"decode": decode, "encode": encode})
    lines = quantization_lines(manifest)
    assert [line.split("[")[1].split("]")[0] for line in lines[:3]] == [
        "prefill", "decode", "encode"]
    assert "each of the 3 entry points holds its own" in lines[3] and "about 0.84 MB" in lines[3]
    # a store that only the CPU fallback reads (an MoE's experts) leaves the line
    fallback = SimpleNamespace(backend="torch", meta={"shared_weights": {"w": "k"}})
    manifest.shared_weights, manifest.partitions = {"entries": {}}, [fallback]
    assert "each of the 3 entry points holds its own" in quantization_lines(manifest)[3]
    shared = SimpleNamespace(backend="aoti", meta={"shared_weights": {"w": "k"}})
    manifest.partitions = [shared, fallback]
    assert len(quantization_lines(manifest)) == 3  # shared: one copy, nothing to add


def test_cpu_int4_linear_multiplies_by_the_grouped_int4_weight():
    """ATen's CPU int4 GEMM over our packing computes x @ dequantized(w).T: the values
    torchao's asymmetric quantization chose, per group of 32 (bf16 rows inside)."""
    from torchao.quantization.utils import groupwise_affine_quantize_tensor

    from passes.quantize import int4_cpu
    torch.manual_seed(0)
    weight, x, bias = torch.randn(96, 256), torch.randn(2, 5, 256), torch.randn(96)
    packed, scales_and_zeros = int4_cpu.pack(weight)
    values, _ = groupwise_affine_quantize_tensor(weight, 4, int4_cpu.GROUP, dtype=torch.bfloat16)
    scale, zero = (t.float().T[..., None] for t in scales_and_zeros.unbind(-1))  # [out, groups, 1]
    dequantized = ((values.float().view(96, -1, int4_cpu.GROUP) - 8) * scale + zero).view(96, 256)
    got = int4_cpu.linear(x, packed, scales_and_zeros, 96, bias)
    expected = x.bfloat16().float() @ dequantized.T + bias
    sqnr = 10 * torch.log10(weight.pow(2).mean() / (weight - dequantized).pow(2).mean())
    assert got.shape == (2, 5, 96) and got.dtype == torch.float32
    assert packed.dtype == torch.uint8 and packed.numel() == weight.numel() // 2
    torch.testing.assert_close(got, expected, rtol=0.02, atol=0.3)  # bf16 output rounding
    assert sqnr > 18  # 4 bits of a Gaussian in groups of 32: ~22 dB measured
    assert int4_cpu.pack(torch.randn(8, 40)) == ("in_features 40 is not a multiple of the "
                                                 "int4 group (32)")
    assert "out_features 10 is not a multiple of 16" in int4_cpu.pack(torch.randn(10, 64))


def test_pt2e_quantization_reads_the_float_weights_without_copying_them(monkeypatch):
    """The PT2E pass deep-copied the program's module, weights and all, so a 1.1B
    decoder's build held its 4.4 GB of float weights twice and ran out of memory. The
    module PT2E is given reads the same storage; the user's model keeps its weights."""
    import torchao.quantization.pt2e.quantize_pt2e as pt2e

    from passes.quantize.quantize import QuantizePT2E
    from targets.registry import get_target
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 8)).eval()
    kept = {name: p.detach().clone() for name, p in model.named_parameters()}
    program = torch.export.export(model, (torch.randn(4, 16),))
    given, prepare = [], pt2e.prepare_pt2e
    monkeypatch.setattr(pt2e, "prepare_pt2e",
                        lambda module, quantizer: given.append(module) or prepare(module,
                                                                                   quantizer))
    cpu = get_target("cpu")
    info = QuantizePT2E("int8-dynamic", lambda: cpu.quantization.quantizer("int8-dynamic"),
                        [], "test")(program).info
    assert len(info["layers_quantized"]) == 2
    storage = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert {t.untyped_storage().data_ptr() for t in given[0].parameters()} <= storage
    for name, p in model.named_parameters():
        assert torch.equal(p, kept[name])


def test_weight_only_quantization_reads_the_float_weights_without_copying_them(monkeypatch):
    """As PT2E's: the weight-only pass deep-copied the program's module, weights and all
    (a second copy of the float weights, on the GPU for a cuda build). The module torchao
    is given reads the same storage; the user's model keeps its weights."""
    import passes.quantize.quantize_weight_only as weight_only
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 8)).eval()
    kept = {name: p.detach().clone() for name, p in model.named_parameters()}
    program = torch.export.export(model, (torch.randn(4, 64),))
    given, quantize = [], weight_only.quantize_weights

    def storages_then_quantize(module, *args, **kwargs):
        given.append({t.untyped_storage().data_ptr() for t in module.parameters()})
        return quantize(module, *args, **kwargs)
    monkeypatch.setattr(weight_only, "quantize_weights", storages_then_quantize)
    info = weight_only.QuantizeWeightOnly("int8-weight", "test", "cpu")(program).info
    assert len(info["layers_quantized"]) == 2
    assert given[0] <= {p.untyped_storage().data_ptr() for p in model.parameters()}
    for name, p in model.named_parameters():
        assert torch.equal(p, kept[name])
