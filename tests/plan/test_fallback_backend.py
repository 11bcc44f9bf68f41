"""The CPU-fallback backend ("torch"): export JSON + safetensors in, eager-equal outputs out.

Fast: no compiler runs. Each case exports, lowers with targets.fallback, loads through
the runtime's executor registry and compares with the ExportedProgram's own module.
"""

from __future__ import annotations

import dataclasses

import json
from pathlib import Path

import pytest
import torch
from torch.export import Dim

from runtime.errors import ArtifactError, CompatibilityError, ExecutionError, ToolchainError
from runtime.executors import create_executor
from runtime.format.manifest import Partition
from targets.fallback import FALLBACK_BACKEND, FallbackSerializationError, lower_fallback
from tests.conftest import ROOT


@torch.library.custom_op("testlib::scaled_add", mutates_args=())
def scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return x + alpha * y


@scaled_add.register_fake
def _(x, y, alpha):
    return torch.empty_like(x)


class MLP(torch.nn.Module):
    """Parameters, a persistent and a non-persistent buffer, a lifted constant, a transposed
    (non-contiguous) weight view and a tied (shared-storage) weight."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 8)
        self.fc3 = torch.nn.Linear(16, 8)
        self.fc3.weight = self.fc2.weight  # tied
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 16))
        self.register_buffer("shift", torch.randn(8, 4).t(), persistent=False)  # strided
        self.offset = torch.randn(8)  # plain attribute: a lifted tensor constant

    def forward(self, x):
        h = torch.relu(self.fc1(x)) * self.scale
        return self.fc2(h) + self.offset, self.fc3(h) + self.shift[0]


class CustomOp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x, y):
        return (torch.ops.testlib.scaled_add(self.fc(x), y, 0.5),)


def _build(program, tmp_path: Path) -> Partition:
    lowered = lower_fallback(program, tmp_path)
    names = [s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    return Partition(name="p0", backend=FALLBACK_BACKEND, device="cpu",
                     files=tuple(lowered.files), inputs=tuple(names),
                     outputs=tuple(f"out{i}" for i in range(len(program.graph_signature.user_outputs))),
                     meta=dict(lowered.meta))


def _check(program, partition, tmp_path, inputs) -> None:
    run = create_executor(partition, tmp_path, where="test")
    got = run(list(inputs))
    want = torch.utils._pytree.tree_leaves(program.module()(*inputs))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def _export_mlp():
    return torch.export.export(MLP().eval(), (torch.randn(3, 8),))


def test_mlp_with_buffers_and_constants(tmp_path):
    program = _export_mlp()
    partition = _build(program, tmp_path)
    assert partition.meta["program"] == "program.json"
    assert partition.meta["weights"] == "weights.safetensors"
    _check(program, partition, tmp_path, (torch.randn(3, 8),))


def test_custom_op_serializes_by_name(tmp_path):
    program = torch.export.export(CustomOp(), (torch.randn(2, 4), torch.randn(2, 4)))
    partition = _build(program, tmp_path)
    assert "torch.ops.testlib.scaled_add.default" in (tmp_path / "program.json").read_text()
    _check(program, partition, tmp_path, (torch.randn(2, 4), torch.randn(2, 4)))


def test_dynamic_batch(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.GELU(), torch.nn.Linear(6, 2))
    batch = Dim("batch", min=1, max=16)
    program = torch.export.export(model, (torch.randn(2, 6),), dynamic_shapes=({0: batch},))
    partition = _build(program, tmp_path)
    run = create_executor(partition, tmp_path, where="test")
    for n in (2, 1, 11, 16):
        x = torch.randn(n, 6)
        torch.testing.assert_close(run([x])[0], program.module()(x), rtol=0, atol=0)


def test_no_pickle_anywhere(tmp_path, monkeypatch):
    program = _export_mlp()
    partition = _build(program, tmp_path)
    for path in tmp_path.iterdir():
        assert not path.read_bytes().startswith(b"\x80"), f"{path.name} looks like a pickle"

    def refuse(*_a, **_k):
        raise AssertionError("the fallback executor must never call torch.load / pickle")

    import pickle
    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    _check(program, partition, tmp_path, (torch.randn(3, 8),))


def _tamper(tmp_path: Path, edit) -> Partition:
    partition = _build(_export_mlp(), tmp_path)
    path = tmp_path / "program.json"
    path.write_text(edit(path.read_text()))
    return partition


@pytest.mark.parametrize("edit", [
    pytest.param(lambda text: text[: len(text) // 2], id="truncated"),
    pytest.param(lambda text: "[1, 2, 3]", id="not-a-program"),
    pytest.param(lambda text: text.replace('"as_tensor"', '"as_bogus"', 1), id="bad-union"),
    pytest.param(lambda text: text.replace("torch.ops.aten.relu.default",
                                           "torch.ops.aten.relu.nosuchoverload"), id="bad-op"),
    pytest.param(lambda text: text.replace('"fc1.weight"', '"fc1.nowhere"'), id="dangling-weight"),
])
def test_malformed_program_is_a_clean_error(tmp_path, edit):
    partition = _tamper(tmp_path, edit)
    with pytest.raises(ToolchainError) as info:
        create_executor(partition, tmp_path, where="test")
    assert isinstance(info.value, (ArtifactError, ExecutionError, CompatibilityError))
    assert "Where: test" in str(info.value)


def test_unregistered_custom_op_names_it(tmp_path):
    partition = _tamper(tmp_path, lambda text: text.replace(
        "torch.ops.aten.relu.default", "torch.ops.mylib.foo.default"))
    with pytest.raises(CompatibilityError, match="'mylib::foo'.*not registered") as info:
        create_executor(partition, tmp_path, where="test")
    assert "import the library" in str(info.value)
    # the build records the installed module that registers a custom op: the hint names it
    named = dataclasses.replace(partition, meta={
        **partition.meta, "custom_op_modules": {"mylib.foo": "mylib.ops"}})
    with pytest.raises(CompatibilityError) as info:
        create_executor(named, tmp_path, where="test")
    assert "--preload mylib.ops" in str(info.value)


def test_newer_schema_major_is_a_compatibility_error(tmp_path):
    def bump(text):
        raw = json.loads(text)
        raw["schema_version"]["major"] += 1
        return json.dumps(raw)
    with pytest.raises(CompatibilityError, match="export schema"):
        create_executor(_tamper(tmp_path, bump), tmp_path, where="test")


def test_missing_weights_is_an_artifact_error(tmp_path):
    partition = _build(_export_mlp(), tmp_path)
    (tmp_path / "weights.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(ArtifactError, match="weights"):
        create_executor(partition, tmp_path, where="test")


def test_unserializable_op_is_named(tmp_path):
    program = _export_mlp()

    def double(t):  # a plain Python call no export schema can name
        return t * 2

    output = program.graph.output_node()
    first = output.args[0][0]
    with program.graph.inserting_before(output):
        node = program.graph.call_function(double, (first,))
        node.meta = dict(first.meta)
    output.args = ((node, *output.args[0][1:]),)
    program.graph_module.recompile()
    with pytest.raises(FallbackSerializationError, match="serializer") as info:
        lower_fallback(program, tmp_path)
    assert any("double" in line for line in info.value.details)


def test_complex_values_do_not_cross_between_onnx_and_the_fallback():
    """ONNX has no complex tensors (torch.onnx passes one as real pairs): DeepSeek-V2's
    complex rotary had an op the ONNX translation refuses (a complex unsqueeze) between
    ops it takes, and the fallback's program refused the [..., 2] value it was handed.
    Placement now keeps the ops on either side of a complex value together."""
    from exporter.builder.placement import place
    from targets import get_target

    class ComplexRotary(torch.nn.Module):
        def forward(self, x, angles):
            rotated = torch.view_as_complex(x.view(4, 8, 2))
            turn = torch.polar(torch.ones_like(angles), angles).unsqueeze(0)
            return torch.view_as_real(rotated * turn).flatten(1) + 1

    program = torch.export.export(ComplexRotary(), (torch.randn(4, 16), torch.randn(8)))
    placement = place(program, get_target("onnx"), 1)
    side = {node: plan.delegated for plan in placement.plans for node in plan.nodes}
    crossing = [(node.name, user.name) for node, on_onnx in side.items()
                if isinstance(node.meta.get("val"), torch.Tensor) and node.meta["val"].is_complex()
                for user in node.users if side.get(user, on_onnx) != on_onnx]
    assert crossing == [] and any(side.values())  # the real ops still run on onnx


class Experts(torch.nn.Module):
    """transformers' CPU experts kernel as its MoE layers call it (rows sorted by expert)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 8, 6))

    def forward(self, rows, offs):
        return (torch.ops.transformers.grouped_mm_fallback(rows, self.weight, offs),)


_BLOCKED_RUN = """
import json, sys
from pathlib import Path
class Block:  # a device without transformers
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'transformers':
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Block())
import torch
from runtime.executors import create_executor
from runtime.format.manifest import Partition
folder, = sys.argv[1:]
raw = json.load(open(folder + '/partition.json'))
partition = Partition(**{**raw, 'files': tuple(raw['files']), 'inputs': tuple(raw['inputs']),
                         'outputs': tuple(raw['outputs'])})
inputs = torch.load(folder + '/inputs.pt')
torch.save(create_executor(partition, Path(folder), where='test')(inputs), folder + '/got.pt')
print('transformers' in sys.modules)
"""


def test_transformers_experts_run_without_transformers(tmp_path):
    """A MoE artifact's fallback partition calls transformers::grouped_mm_fallback; on a
    device without transformers the runtime registers its own kernel (runtime/executors/custom_ops.py),
    equal to transformers' (empty experts included), with no --preload."""
    import subprocess
    import sys

    pytest.importorskip("transformers.integrations.moe")
    from runtime.executors.custom_ops import _grouped_mm_fallback
    rows, weight = torch.randn(7, 8), torch.randn(4, 8, 6)
    for offs in ([2, 2, 5, 7], [0, 0, 0, 7], [7, 7, 7, 7]):
        offs = torch.tensor(offs)
        torch.testing.assert_close(_grouped_mm_fallback(rows, weight, offs),
                                   torch.ops.transformers.grouped_mm_fallback(rows, weight, offs),
                                   rtol=0, atol=0)
    offs = torch.tensor([1, 3, 3, 7])
    program = torch.export.export(Experts().eval(), (rows, offs))
    partition = _build(program, tmp_path)
    assert "torch.ops.transformers.grouped_mm_fallback" in (tmp_path / "program.json").read_text()
    (tmp_path / "partition.json").write_text(json.dumps(dataclasses.asdict(partition)))
    torch.save([rows, offs], tmp_path / "inputs.pt")
    done = subprocess.run([sys.executable, "-c", _BLOCKED_RUN, str(tmp_path)],
                          capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"  # transformers was not imported
    want = program.module()(rows, offs)[0]
    torch.testing.assert_close(torch.load(tmp_path / "got.pt")[0], want, rtol=0, atol=0)
