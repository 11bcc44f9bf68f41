"""Typed partition metadata (runtime/executors/meta.py), the Executor protocol and the
registry of executor kinds. Fast: nothing is compiled; the plug-in artifact is written
by hand."""

from __future__ import annotations

import importlib.metadata
import json
import platform
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import runtime
from runtime import executors
from exporter.ship.archive_writer import write_artifact
from runtime.errors import ArtifactError, CompatibilityError
from runtime.executors import Executor, create_executor, parse_meta, register_executor
from runtime.executors.aoti import AotiMeta
from runtime.executors.meta import MAX_STRING, Entry, PartitionMeta
from runtime.executors.onnxruntime import OnnxRuntimeMeta
from runtime.executors.torch_fallback import PROGRAM_KEY, WEIGHTS_KEY, TorchFallbackMeta
from runtime.executors.tvm import TvmMeta
from runtime.format.manifest import Dim, Manifest, Partition, Requirements, Signature, TensorSpec
from runtime.format.weights import INDEX_KEY
from runtime.program.cuda_graphs import GraphReplay

# What each lowering writes today, after the build's rewrite to entry names (and without
# its *_seconds keys): to_json must give these back key for key, value for value.
WRITTEN = {
    AotiMeta: {"package": "partitions/p0/model.pt2",
               "inductor_configs": {"cpp.enable_kernel_profile": False, "max_autotune": False},
               "compiler": "/usr/bin/g++ 12.2.0 (links libstdc++ dynamically)"},
    OnnxRuntimeMeta: {"model": "partitions/p0/model.onnx", "external_data": ["model.onnx.data"],
                      "providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
                      "opset": 18, "fallback": "warn", "disable_cpu_ep_fallback": False,
                      "onnxruntime": "1.24.1", "onnx": "1.19.1",
                      "quantization": {"recipe": "dynamic-int8", "nodes": {"MatMul": 3}}},
    TvmMeta: {"library": "partitions/p0/model.so", "params": "partitions/p0/params.safetensors",
              "num_params": 2, INDEX_KEY: {"params": {"p0": ["F32", [4, 4]], "p1": ["F32", [4]]}},
              "tvm_target": "llvm -mcpu=znver3", "tvm": "0.22.0", "tune_trials": 0,
              "schedules": {"how": "default", "prim_funcs": {"matmul": "dlight"}}},
    TorchFallbackMeta: {"program": "partitions/p1/program.json",
                        "weights": "partitions/p1/weights.safetensors", "schema_version": "8.13",
                        INDEX_KEY: {"weights": {"param/fc.weight": ["F32", [4, 4]]}},
                        "weights_count": 1, "weights_bytes": 64, "custom_ops": ["testlib.op"]},
}


@pytest.mark.parametrize("meta_class", list(WRITTEN), ids=lambda c: c.__name__)
def test_round_trip_keeps_the_manifest_identical(meta_class):
    raw = WRITTEN[meta_class]
    meta = meta_class.from_json(raw, where="test", partition="p0")
    assert json.dumps(meta.to_json(), sort_keys=True) == json.dumps(raw, sort_keys=True)
    assert meta_class.from_json(meta.to_json(), where="test") == meta


def test_optional_fields_stay_optional():
    """Only what the executor needs to run is required; unset fields are not written."""
    meta = OnnxRuntimeMeta.from_json({"model": "m.onnx"}, where="test")
    assert meta.providers is None and meta.quantization is None
    assert meta.to_json() == {"model": "m.onnx", "disable_cpu_ep_fallback": False}
    assert AotiMeta(package=Entry("x.pt2")).to_json() == {"package": "x.pt2"}
    # null stands for "not set", as the executors' meta.get() read it before
    assert TvmMeta.from_json({**WRITTEN[TvmMeta], "tvm": None}, where="test").tvm is None


def test_unknown_keys_are_tolerated():
    raw = {**WRITTEN[AotiMeta], "compile_seconds": 12.5, "added_by_a_newer_toolchain": [1]}
    assert AotiMeta.from_json(raw, where="test") == AotiMeta.from_json(WRITTEN[AotiMeta],
                                                                      where="test")


def test_the_real_fallback_lowering_round_trips(tmp_path):
    from targets.fallback import lower_fallback
    program = torch.export.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
    lowered = lower_fallback(program, tmp_path)
    meta = TorchFallbackMeta.from_json(lowered.meta, where="test")
    assert meta.to_json() == lowered.meta


def test_file_keys_are_declared_by_the_dataclass():
    assert AotiMeta.file_keys() == ("package",)
    assert OnnxRuntimeMeta.file_keys() == ("model", "kernels")  # kernels: our library
    assert TvmMeta.file_keys() == ("library", "params")
    assert TorchFallbackMeta.file_keys() == (PROGRAM_KEY, WEIGHTS_KEY)
    meta = TvmMeta.from_json(WRITTEN[TvmMeta], where="test")
    assert meta.files() == {"library": "partitions/p0/model.so",
                            "params": "partitions/p0/params.safetensors"}
    # the weights index sits under runtime.format.weights.INDEX_KEY on both sides
    assert INDEX_KEY in WRITTEN[TvmMeta] and meta.tensor_index is not None


DROP = object()  # a key removed
BAD = [  # (meta class, change to what the lowering wrote, words the error must say)
    (TvmMeta, {"num_params": DROP}, "the required key 'num_params' is missing"),
    (TvmMeta, {"library": None}, "the required key 'library' is null"),
    (TvmMeta, {"library": 7}, "'library' must be a string, not an integer"),
    (TvmMeta, {"num_params": -1}, "'num_params' must be a non-negative integer"),
    (TvmMeta, {"num_params": True}, "'num_params' must be a non-negative integer"),
    (TvmMeta, {"num_params": 2 ** 70}, "'num_params' must be a non-negative integer"),
    (TvmMeta, {"tvm_target": "x" * (MAX_STRING + 1)}, f"'tvm_target' is a string of {MAX_STRING + 1}"),
    (TvmMeta, {INDEX_KEY: {"params": [1, 2]}}, "meta: 'tensor_index'['params'] must be an object"),
    (TvmMeta, {"schedules": "fast"}, "'schedules' must be an object, not a string"),
    (OnnxRuntimeMeta, {"providers": "CPUExecutionProvider"}, "'providers' must be a list"),
    (OnnxRuntimeMeta, {"providers": ["CPUExecutionProvider", 3]}, "'providers'[1] must be a string"),
    (OnnxRuntimeMeta, {"providers": ["x"] * 70_000}, "'providers' has 70000 items"),
    (OnnxRuntimeMeta, {"disable_cpu_ep_fallback": "yes"}, "'disable_cpu_ep_fallback' must be true or false"),
    (OnnxRuntimeMeta, {"opset": -18}, "'opset' must be a non-negative integer"),
    (TorchFallbackMeta, {"custom_ops": [None]}, "'custom_ops'[0] must be a string, not null"),
    (TorchFallbackMeta, {"weights_bytes": 1.5}, "'weights_bytes' must be a non-negative integer"),
]


@pytest.mark.parametrize("meta_class, change, says", BAD,
                         ids=[f"{c.__name__}-{next(iter(k))}" for c, k, _ in BAD])
def test_malformed_meta_names_the_partition_and_key(meta_class, change, says):
    raw = {**WRITTEN[meta_class], **change}
    raw = {key: value for key, value in raw.items() if value is not DROP}
    with pytest.raises(ArtifactError) as caught:
        meta_class.from_json(raw, where="model.artifact", partition="p0")
    message = str(caught.value)
    assert "partition 'p0'" in message and says in message, message
    assert "model.artifact" in message and len(message) < 1000, message


def test_a_lowering_gets_its_mistakes_at_build_time():
    """The constructor (what a lowering calls) checks like from_json: a misspelt key or a
    wrong value fails when the artifact is built, not on the device."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_parms'"):
        TvmMeta(library=Entry("m.so"), params=Entry("p.safetensors"), num_parms=2)
    with pytest.raises(TypeError, match="TvmMeta.num_params must be a non-negative integer"):
        TvmMeta(library=Entry("m.so"), params=Entry("p.safetensors"), num_params=-2)
    with pytest.raises(TypeError, match="AotiMeta.package is required"):
        AotiMeta(package=None)
    # lists are taken where tuples are declared, and written back the same
    meta = OnnxRuntimeMeta(model=Entry("model.onnx"), providers=["CPUExecutionProvider"])
    assert meta.providers == ("CPUExecutionProvider",)
    assert meta.to_json()["providers"] == ["CPUExecutionProvider"]


def test_meta_that_is_not_an_object_is_refused():
    with pytest.raises(ArtifactError, match="partition 'p0' has a malformed meta: it is not a JSON object"):
        AotiMeta.from_json(["model.pt2"], where="test", partition="p0")


def test_a_manifest_with_bad_meta_is_refused_at_load_with_exit_2(tmp_path):
    partition = Partition(name="p9", backend="tvm", device="cpu", files=(), inputs=(),
                          outputs=(), meta={**WRITTEN[TvmMeta], "num_params": -3})
    with pytest.raises(ArtifactError) as caught:
        create_executor(partition, tmp_path, where="a.artifact")
    assert "partition 'p9'" in str(caught.value) and caught.value.exit_code == 2
    with pytest.raises(ArtifactError):
        parse_meta(partition, where="a.artifact")


# ------------------------------------------------------------------------- plug-ins

@dataclass(frozen=True)
class ScaleMeta(PartitionMeta):
    table: Entry  # a JSON file: {"factor": number}
    repeats: int = 1


class ScaleExecutor:
    """A backend kind from outside the runtime: multiplies its input by a factor read
    from its own artifact entry, ``repeats`` times."""

    Meta = ScaleMeta
    arena_slots = 0

    def __init__(self, factor: float, repeats: int) -> None:
        self.factor, self.repeats = factor, repeats

    @classmethod
    def load(cls, partition, meta: ScaleMeta, files_dir: Path, *, where: str, **options):
        factor = json.loads((files_dir / meta.table).read_text())["factor"]
        return cls(factor, meta.repeats)

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [inputs[0] * self.factor ** self.repeats]

    def report(self) -> dict:
        return {"factor": self.factor}


@pytest.fixture
def registry(monkeypatch):
    """A private copy of the registry, so no kind registered here outlives the test."""
    monkeypatch.setattr(executors, "_KINDS", dict(executors._KINDS))
    return executors


def _spec(name: str) -> TensorSpec:
    return TensorSpec(name, "float32", (Dim(size=2), Dim(size=3)))


def _artifact(tmp_path: Path, backend: str, table: str = "partitions/p0/table.json") -> Path:
    partition = Partition(name="p0", backend=backend, device="cpu",
                          files=("partitions/p0/table.json",), inputs=("x",), outputs=("y",),
                          meta=ScaleMeta(table=Entry(table), repeats=2).to_json())
    manifest = Manifest(target="scale", signature=Signature((_spec("x"),), (_spec("y"),)),
                        partitions=[partition],
                        requirements=Requirements(arch=platform.machine(),
                                                  torch=torch.__version__))
    return write_artifact(tmp_path / "scale.artifact", manifest.to_dict(),
                          {"partitions/p0/table.json": b'{"factor": 3.0}'})


def test_a_registered_plugin_runs_inside_program(tmp_path, registry):
    register_executor("scale-by", ScaleExecutor)
    assert "scale-by" in registry.kinds()
    program = runtime.load(_artifact(tmp_path, "scale-by"))
    x = torch.randn(2, 3)
    torch.testing.assert_close(program.run({"x": x})["y"], x * 9)
    torch.testing.assert_close(program.run([x])["y"], x * 9)  # the one-CPU-partition path
    assert isinstance(program.executors[0], Executor)
    assert program.backend_reports == {"p0": {"factor": 3.0, "placement": None}}


def test_a_plugin_file_key_must_name_a_verified_entry(tmp_path, registry):
    register_executor("scale-by", ScaleExecutor)
    with pytest.raises(ArtifactError, match="points its 'table' at '../table.json'"):
        runtime.load(_artifact(tmp_path, "scale-by", table="../table.json"))


def test_an_installed_plugin_is_found_by_entry_point_only_when_needed(tmp_path, registry,
                                                                       monkeypatch):
    asked = []

    def entry_points(*, group):
        asked.append(group)
        return [importlib.metadata.EntryPoint(
            name="scale-by", value="tests.runtime.test_partition_meta:ScaleExecutor", group=group)]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    program = runtime.load(_artifact(tmp_path, "scale-by"))
    assert asked == [executors.ENTRY_POINT_GROUP]
    x = torch.ones(2, 3)
    torch.testing.assert_close(program.run([x])["y"], x * 9)
    runtime.load(_artifact(tmp_path, "scale-by"))  # known now: not looked up again
    assert len(asked) == 1


def test_an_unknown_backend_names_the_kinds_this_runtime_has(tmp_path, registry, monkeypatch):
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda *, group: [])
    with pytest.raises(CompatibilityError) as caught:
        runtime.load(_artifact(tmp_path, "scale-by"))
    message = str(caught.value)
    assert "needs backend 'scale-by'" in message
    # the built-in five, and any kind an earlier test in this process registered (the toy
    # target's tests/toy_target/register.py adds 'toy-relu' when an artifact preloads it)
    listed = message.split("it has: ", 1)[1].split(")", 1)[0].split(", ")
    assert {"aoti", "executorch", "onnxruntime", "torch", "tvm"} <= set(listed)
    assert listed == sorted(registry._KINDS) and "scale-by" not in listed


def test_registration_checks_the_loader(registry):
    with pytest.raises(ValueError, match="already registered"):
        register_executor("aoti", ScaleExecutor)

    class NoMeta:
        load = ScaleExecutor.load

    with pytest.raises(TypeError, match="has no Meta"):
        register_executor("no-meta", NoMeta)

    @dataclass(frozen=True)
    class SetMeta(PartitionMeta):
        names: set

    class BadTypes(ScaleExecutor):
        Meta = SetMeta

    with pytest.raises(TypeError, match="SetMeta.names: partition meta cannot hold"):
        register_executor("bad-types", BadTypes)
    register_executor("aoti", ScaleExecutor, replace=True)  # on purpose, it may


def test_graph_replay_reports_what_it_wraps():
    replay = GraphReplay(ScaleExecutor(2.0, 1), "cuda")
    assert isinstance(replay, Executor)
    assert replay.report() == {"factor": 2.0} and replay.arena_slots == 0


def test_onnxruntime_executor_hands_program_its_plain_function(tmp_path):
    """Its __call__ is a slot holding ort_binding's function: Program calls that directly."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in "xy")
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    onnx.save(model, str(tmp_path / "model.onnx"))
    meta = OnnxRuntimeMeta(model=Entry("model.onnx"), providers=("CPUExecutionProvider",))
    partition = Partition(name="p0", backend="onnxruntime", device="cpu", files=(),
                          inputs=("x",), outputs=("y",), meta=meta.to_json())
    execute = create_executor(partition, tmp_path, where="test")
    assert isinstance(execute, Executor) and execute.arena_slots == 0
    assert type(execute.__call__).__name__ == "function"
    value = torch.randn(2, 3)
    torch.testing.assert_close(execute([value])[0], -value)
    torch.testing.assert_close(execute.__call__([value])[0], -value)
    report = execute.report()
    assert report["used"] == ["CPUExecutionProvider"] and "placement" in report
    assert execute.session.get_inputs()[0].name == "x"  # what `exporter bench` reads


def test_the_torch_kinds_declarations_known_without_importing_them_match_their_classes():
    """inspect and the bundle's lock read a kind's declarations before torch is imported;
    the static answer for the built-in torch kinds must be what the classes say."""
    from runtime.executors import _TORCH_KINDS, _resolve
    for kind, declared in _TORCH_KINDS.items():
        partition = Partition(name="p0", backend=kind, device="cpu", files=[], inputs=[],
                              outputs=[], meta={})
        loader = _resolve(kind, executors._BUILTIN[kind], partition, "")
        assert declared == (bool(getattr(loader, "arrays", False)),
                            tuple(getattr(loader, "array_packages", ())),
                            bool(getattr(loader, "portable", False))), kind
