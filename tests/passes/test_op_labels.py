"""How placement tables and bisect lines name what a node calls: never a Python repr."""

from __future__ import annotations

import operator

import torch

from passes.graph.ops import op_label


def test_a_getitem_node_is_named_operator_getitem_not_its_repr():
    class Split(torch.nn.Module):
        def forward(self, x):
            first, _ = torch.split(x, 2, dim=1)
            return first * x.shape[0]

    program = torch.export.export(Split(), (torch.randn(3, 4),))
    labels = {op_label(node.target) for node in program.graph.nodes
              if node.op == "call_function"}
    assert "operator.getitem" in labels
    assert "aten.split.Tensor" in labels or "aten.split_with_sizes.default" in labels
    assert not any(label.startswith("<") for label in labels)


def test_functions_are_named_by_module_and_name():
    assert op_label(operator.getitem) == "operator.getitem"
    assert op_label(torch.sym_max) == "torch.sym_max"
    assert op_label(torch.ops.aten.add.Tensor) == "aten.add.Tensor"
