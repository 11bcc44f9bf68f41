"""Target ``onnx`` and the ONNX Runtime executor, one partition at a time (no AOTInductor)."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
pytest.importorskip("onnxscript")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from exporter.model import zoo  # noqa: E402
from runtime.errors import ArtifactError, CompatibilityError  # noqa: E402
from runtime.executors import create_executor  # noqa: E402
from runtime.format.manifest import Partition  # noqa: E402
from targets.base import LowerOptions  # noqa: E402
from targets.errors import TargetOptionError  # noqa: E402
from targets import FallbackPolicy, LoweringError  # noqa: E402
from targets.onnx.providers import provider_names  # noqa: E402
from targets.onnx.target import OnnxOptions, OnnxTarget  # noqa: E402

TARGET = OnnxTarget()


@torch.library.custom_op("onnxtest::scale", mutates_args=())
def _scale(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@_scale.register_fake
def _(x):
    return torch.empty_like(x)


class UsesCustomOp(torch.nn.Module):
    def forward(self, x):
        return torch.ops.onnxtest.scale(x) + 1


def _capture(name: str):
    module, args, dynamic = zoo.ZOO[name]()
    return module, args, torch.export.export(module, args, dynamic_shapes=dynamic)


def _executor(tmp_path, lowered, program, **options):
    partition = Partition(
        name="p0", backend="onnxruntime", device="cpu", files=tuple(lowered.files),
        inputs=tuple(program.graph_signature.user_inputs),
        outputs=tuple(str(o) for o in program.graph_signature.user_outputs),
        meta=lowered.meta)
    return create_executor(partition, tmp_path, where="test", **options)


def _lower(tmp_path, program, providers: str = "cpu", fallback: str = "warn"):
    return TARGET.lower(program, LowerOptions(work_dir=tmp_path, target=OnnxOptions(ep=providers),
                                              fallback=FallbackPolicy(fallback)))


def test_mlp_matches_eager_at_two_batches_and_keeps_batch_symbolic(tmp_path):
    module, (x,), program = _capture("mlp")
    lowered = _lower(tmp_path, program)
    assert lowered.meta["model"] == "model.onnx" and lowered.meta["external_data"] == []
    assert lowered.files == {"model.onnx": tmp_path / "model.onnx"}
    assert lowered.meta["onnxruntime"] and lowered.meta["opset"] >= 18
    batch = onnx.load(str(tmp_path / "model.onnx")).graph.input[0].type.tensor_type.shape.dim[0]
    assert batch.dim_param and not batch.dim_value  # symbolic, not specialised to 2

    run = _executor(tmp_path, lowered, program)
    for batch_size in (2, 7):
        inp = torch.randn(batch_size, x.shape[1])
        (out,) = run([inp])
        assert out.shape == (batch_size, 10)
        torch.testing.assert_close(out, module(inp), rtol=1e-4, atol=1e-5)
    report = run.report()
    assert report["used"] == ["CPUExecutionProvider"]
    if report["placement_recorded"]:
        assert set(report["placement"]) == {"CPUExecutionProvider"}
        assert report["placement"]["CPUExecutionProvider"]["nodes"] > 0


def test_encoder_int_inputs_and_dict_outputs(tmp_path):
    module, (ids, mask), program = _capture("encoder")
    run = _executor(tmp_path, _lower(tmp_path, program), program)
    for batch_size in (2, 5):
        ids_b = torch.randint(0, zoo.VOCAB, (batch_size, ids.shape[1]))
        mask_b = torch.ones_like(ids_b)
        mask_b[:, -3:] = 0
        expected = module(ids_b, mask_b)
        hidden, pooled = run([ids_b, mask_b])  # dict outputs, flattened in pytree order
        torch.testing.assert_close(hidden, expected["last_hidden_state"], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(pooled, expected["pooled"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(zoo.ZOO))
def test_every_zoo_op_is_supported_with_a_reason(name):
    *_, program = _capture(name)
    for node in program.graph.nodes:
        if node.op == "call_function":
            support = TARGET.supports(node)
            assert support.ok, (node.target, support.reason)
            assert support.reason


def test_reasons_name_the_translation_or_the_decomposition():
    *_, program = _capture("cnn")
    reasons = {str(n.target): TARGET.supports(n).reason
               for n in program.graph.nodes if n.op == "call_function"}
    assert reasons["aten.add.Tensor"] == "ONNX exporter has a translation (torchlib aten_add)"
    assert reasons["aten.adaptive_avg_pool2d.default"] == "decomposed, then translated"


def test_custom_op_is_not_supported_and_lowering_names_it(tmp_path):
    program = torch.export.export(UsesCustomOp(), (torch.randn(2, 3),))
    node = next(n for n in program.graph.nodes if "onnxtest" in str(n.target))
    support = TARGET.supports(node)
    assert not support.ok
    assert support.reason == "no ONNX translation registered for onnxtest::scale (custom op)"
    with pytest.raises(LoweringError) as info:
        TARGET.lower(program, LowerOptions(work_dir=tmp_path / "p3", log_dir=tmp_path / "logs"))
    assert "partition 'p3'" in str(info.value) and "onnxtest::scale" in str(info.value)
    assert str(tmp_path / "logs") in info.value.where  # torch.onnx's report is kept there


def test_provider_names():
    assert provider_names("cpu") == ["CPUExecutionProvider"]
    assert provider_names(" CUDA, tensorrt ,qnn") == [
        "CUDAExecutionProvider", "TensorrtExecutionProvider", "QNNExecutionProvider"]
    assert provider_names("DmlExecutionProvider") == ["DmlExecutionProvider"]
    with pytest.raises(TargetOptionError, match="coreml"):  # the hint lists the known names
        provider_names("npu")
    with pytest.raises(TargetOptionError):
        provider_names(" , ")


def test_bad_fallback_and_provider_options_are_rejected_with_the_choices():
    import pydantic

    from exporter.settings import BuildSettings
    with pytest.raises(pydantic.ValidationError, match="forbid"):
        BuildSettings(target="onnx", fallback="never")
    with pytest.raises(pydantic.ValidationError, match="coreml"):
        BuildSettings(target="onnx", ep="npu")


def _model_with_external_weight(folder, location: str):
    weight = numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("length", "16")):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    return Partition(name="p0", backend="onnxruntime", device="cpu", files=("p0/model.onnx",),
                     inputs=("x",), outputs=("y",),
                     meta={"model": "p0/model.onnx", "providers": ["CPUExecutionProvider"]})


@pytest.mark.parametrize("location", ["../evil.bin", "/etc/passwd", "sub/../../evil.bin",
                                      "..\\evil.bin"])
def test_external_data_outside_the_partition_folder_is_rejected(tmp_path, location):
    np.ones((2, 2), np.float32).tofile(tmp_path / "evil.bin")
    partition = _model_with_external_weight(tmp_path / "p0", location)
    with pytest.raises(ArtifactError, match="outside its folder"):
        create_executor(partition, tmp_path, where="test")


def test_external_data_next_to_the_model_loads(tmp_path):
    np.full((2, 2), 5, np.float32).tofile(tmp_path / "w.bin")
    (tmp_path / "p0").mkdir()
    np.full((2, 2), 5, np.float32).tofile(tmp_path / "p0" / "w.bin")
    run = create_executor(_model_with_external_weight(tmp_path / "p0", "w.bin"), tmp_path,
                          where="test")
    assert run([torch.zeros(2, 2)])[0].tolist() == [[5.0, 5.0], [5.0, 5.0]]


def test_forbidden_fallback_is_recorded_and_enforced(tmp_path):
    *_, program = _capture("mlp")
    lowered = _lower(tmp_path, program, providers="cuda", fallback="forbid")
    assert lowered.meta["disable_cpu_ep_fallback"] is True
    assert lowered.meta["providers"] == ["CUDAExecutionProvider"]
    import onnxruntime
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        assert any("CUDAExecutionProvider" in note for note in lowered.notes)
        with pytest.raises(CompatibilityError, match="CUDAExecutionProvider") as info:
            _executor(tmp_path, lowered, program)
        assert "forbids CPU fallback" in str(info.value)
    # An available provider that cannot run the nodes: ORT refuses the session
    # because the CPU may not take over (Azure runs no ONNX ops).
    if "AzureExecutionProvider" in onnxruntime.get_available_providers():
        with pytest.raises(CompatibilityError, match="could not load"):
            _executor(tmp_path, lowered, program, providers=["AzureExecutionProvider"])


def test_missing_provider_warns_and_runs_on_cpu_when_fallback_allowed(tmp_path, caplog):
    import onnxruntime
    if "QNNExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("QNN is available here")
    module, (x,), program = _capture("mlp")
    lowered = _lower(tmp_path, program, providers="qnn,cpu", fallback="allow")
    assert lowered.meta["disable_cpu_ep_fallback"] is False
    with caplog.at_level(logging.WARNING, logger="runtime.executors.onnxruntime"):
        run = _executor(tmp_path, lowered, program)
    assert "QNNExecutionProvider" in caplog.text
    assert run.report()["missing"] == ["QNNExecutionProvider"]
    assert run.report()["used"] == ["CPUExecutionProvider"]
    torch.testing.assert_close(run([x])[0], module(x), rtol=1e-4, atol=1e-5)


def test_session_options_carry_the_no_fallback_entry(tmp_path, monkeypatch):
    """Inspect what the executor hands ORT: the config entry is set under 'forbid'."""
    import onnxruntime
    seen = {}
    real = onnxruntime.InferenceSession

    def spy(path, options, providers):
        seen["entry"] = options.get_session_config_entry("session.disable_cpu_ep_fallback")
        return real(path, providers=["CPUExecutionProvider"])  # without the entry

    monkeypatch.setattr(onnxruntime, "InferenceSession", spy)
    monkeypatch.setattr(onnxruntime, "get_available_providers",
                        lambda: ["FakeExecutionProvider", "CPUExecutionProvider"])
    *_, program = _capture("mlp")
    lowered = _lower(tmp_path, program, providers="FakeExecutionProvider", fallback="forbid")
    # 'forbid' cannot stop ORT here (the spy swaps in the CPU), so this only checks the flag.
    run = _executor(tmp_path, lowered, program)
    assert seen["entry"] == "1"
    assert run.report()["disable_cpu_ep_fallback"] is True


def test_large_weights_go_to_external_data_listed_in_files(tmp_path, monkeypatch):
    """The >1 GB path, exercised with a 0-byte threshold: side file listed and loadable."""
    import targets.onnx.target
    monkeypatch.setattr(targets.onnx.target, "EXTERNAL_DATA_BYTES", 0)
    module, (x,), program = _capture("mlp")
    nodes_before = len(program.graph.nodes)
    lowered = _lower(tmp_path, program)
    assert len(program.graph.nodes) == nodes_before  # the caller's program is left alone
    (data,) = lowered.meta["external_data"]
    assert lowered.files[data] == tmp_path / data and (tmp_path / data).stat().st_size > 0
    run = _executor(tmp_path, lowered, program)
    torch.testing.assert_close(run([x])[0], module(x), rtol=1e-4, atol=1e-5)
