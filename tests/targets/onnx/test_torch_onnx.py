"""The onnx target's call of torch.onnx (targets/onnx/torch_onnx.py): the same ONNX model
as ``torch.onnx.export``, with torch.onnx's op registry built once per process."""

from __future__ import annotations

import pytest
import torch

from targets.onnx import contrib_ops
from targets.onnx.torch_onnx import export, quiet_registry

pytest.importorskip("onnxscript")


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.softmax(torch.nn.functional.gelu(self.proj(x)), dim=-1) * x.sum()


def _program():
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=16)
    return torch.export.export(_Block().eval(), (torch.randn(2, 8),),
                               dynamic_shapes=({0: batch},))


def test_export_writes_the_model_torch_onnx_export_writes(tmp_path):
    program = _program()
    with quiet_registry():
        ours = export(program, tmp_path, contrib_ops.translations())
        theirs = torch.onnx.export(program, (), dynamo=True, optimize=True, verbose=False,
                                   custom_translation_table=contrib_ops.translations())
    assert ours.model_proto.SerializeToString() == theirs.model_proto.SerializeToString()
    assert ours.model_proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param


def test_a_second_export_reuses_the_registry(tmp_path, monkeypatch):
    from torch.onnx._internal.exporter import _registration
    with quiet_registry():
        export(_program(), tmp_path, contrib_ops.translations())

        def rebuilt(*args, **kwargs):
            raise AssertionError("torch.onnx's registry was built again")
        monkeypatch.setattr(_registration.ONNXRegistry, "from_torchlib", rebuilt)
        again = export(_program(), tmp_path, contrib_ops.translations())
    assert {node.op_type for node in again.model_proto.graph.node} >= {"Softmax", "Gelu"}


class _Mixed(torch.nn.Module):
    """Integer and float operands: torch.onnx inserts a cast into the graph it translates."""

    def forward(self, x):
        return x * torch.arange(8) + x.shape[0]


def test_a_decomposed_program_is_translated_without_tracing_it_again(tmp_path, monkeypatch):
    """The onnx target's passes already ran torch.onnx's decomposition table
    (passes/cleanup/decompose.py): such a program is translated as it is, into the model
    torch.onnx.export writes for it, and keeps its own graph (the builder plans it again
    if the partition fails); a fresh capture (TRAINING dialect) is decomposed."""
    from torch.export import ExportedProgram

    from targets.onnx.target import _exporter_tables

    def captured():
        batch = torch.export.Dim("batch", min=1, max=16)
        return torch.export.export(_Mixed(), (torch.randn(2, 8),), dynamic_shapes=({0: batch},))
    decomposed = captured().run_decompositions(_exporter_tables()[1])
    traced = []
    real = ExportedProgram.run_decompositions

    def run_decompositions(self, *args, **kwargs):
        traced.append(self)
        return real(self, *args, **kwargs)
    with quiet_registry():
        theirs = torch.onnx.export(decomposed, (), dynamo=True, optimize=True, verbose=False,
                                   custom_translation_table=contrib_ops.translations())
        monkeypatch.setattr(ExportedProgram, "run_decompositions", run_decompositions)
        code = decomposed.graph_module.code
        ours = export(decomposed, tmp_path, contrib_ops.translations())
        assert traced == [] and decomposed.graph_module.code == code
        fresh = captured()
        export(fresh, tmp_path, contrib_ops.translations())
        assert traced == [fresh]
    assert ours.model_proto.SerializeToString() == theirs.model_proto.SerializeToString()



class _BuiltinNames(torch.nn.Module):
    """An input named as a Python builtin, as nn.Module's own convention names it."""

    def forward(self, input):
        return torch.relu(input) * torch.arange(8) + input.shape[0]


def test_a_decomposed_program_keeps_its_inputs_builtin_names(tmp_path):
    """The graph copy that torch.onnx edits keeps every node's name: fx's namespace renames
    ``input`` to ``input_1``, which the program's signature does not name."""
    from targets.onnx.target import _exporter_tables
    batch = torch.export.Dim("batch", min=1, max=16)
    program = torch.export.export(_BuiltinNames(), (torch.randn(2, 8),),
                                  dynamic_shapes=({0: batch},))
    decomposed = program.run_decompositions(_exporter_tables()[1])
    with quiet_registry():
        ours = export(decomposed, tmp_path, contrib_ops.translations())
    assert [value.name for value in ours.model_proto.graph.input] == ["input"]


class _RelativeBuckets(torch.nn.Module):
    """T5's relative position buckets: log(0) on the diagonal is meant (-inf, clamped)."""

    def forward(self, x):
        steps = torch.arange(4)
        distance = (steps[None, :] - steps[:, None]).abs()
        return x + torch.log(distance.float() / 2).to(torch.int64).clamp(min=0).float()


def test_constant_folding_of_meant_infinities_warns_nothing(tmp_path):
    """torch.onnx's optimizer folds these constants with onnx's numpy reference ops: numpy's
    'divide by zero in log' and 'invalid value in cast' leaked to the user (LongT5)."""
    import warnings
    program = torch.export.export(_RelativeBuckets(), (torch.randn(4, 4),))
    with warnings.catch_warnings(record=True) as caught, quiet_registry():
        warnings.simplefilter("always")
        export(program, tmp_path, {})
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []
