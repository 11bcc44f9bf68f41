"""Copy a strided tensor to contiguous memory before it is reshaped, for backends
without aliasing (ONNX).

torch.onnx decomposes ``reshape`` again under ``backed_size_oblivious`` and then re-runs
the graph on fake tensors (its type-promotion pass). With a batch of 1, a reshape of a
transposed tensor (attention's ``transpose(1, 2).reshape(b, s, -1)``, T5 and BART)
came out as a bare ``view``, which then refused the transposed input: SDPA's output
had strides there under which the transpose was no longer contiguous, though it was at
capture. So a copy goes before every reshape of a strided view (transpose, permute,
slice...) and of anything not contiguous now. An explicit contiguous copy keeps every
later decomposition a legal view; in ONNX it is an Identity, so it costs nothing there.

    before: reshape(transpose(x, 1, 2), [1, 16, 64])
    after:  reshape(clone(transpose(x, 1, 2), contiguous_format), [1, 16, 64])
"""

from __future__ import annotations

import operator

import torch
from torch.export import ExportedProgram

from passes.base import PassResult

aten = torch.ops.aten
_RESHAPES = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
# Ops whose output strides depend on their input's (and so on kernels' layout choices)
_STRIDED = {aten.transpose.int, aten.permute.default, aten.t.default, aten.slice.Tensor,
            aten.select.int, aten.expand.default, aten.as_strided.default,
            aten.split.Tensor, aten.split_with_sizes.default, aten.narrow.default}


class ContiguousBeforeReshape:
    name = "contiguous_before_reshape"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        graph, count = program.graph, 0
        for node in list(graph.nodes):
            source = node.args[0] if node.op == "call_function" and node.args else None
            if node.target not in _RESHAPES or not isinstance(source, torch.fx.Node):
                continue
            value = source.meta.get("val")
            if not isinstance(value, torch.Tensor) or (value.is_contiguous()
                                                       and not _strided(source)):
                continue
            with graph.inserting_before(node):
                copy = graph.call_function(aten.clone.default, (source,),
                                           {"memory_format": torch.contiguous_format})
            copy.meta = {**source.meta, "val": value.contiguous()}
            node.replace_input_with(source, copy)
            count += 1
        if count:
            program.graph_module.recompile()
        return PassResult(program, modified=bool(count), info={"copies_inserted": count})


def _strided(node: torch.fx.Node) -> bool:
    if node.target is operator.getitem:  # a piece of split/unbind
        node = node.args[0]
    return node.op == "call_function" and node.target in _STRIDED
