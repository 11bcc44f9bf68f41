"""A linear whose output width is not a multiple of 16 bytes (GPT-2's 50257-word head),
computed over a weight padded with zero rows to that multiple, then sliced; as a candidate
(``LinearInputsAlignedByPadding``), one whose input width is not (MLP-Mixer's token MLP,
196 tokens) too, over zero weight columns and its input padded with zeros.

    before: y = linear(x, W, b)                       W: [N, K], N * itemsize % 16 != 0
    after:  y = linear(x, [W; 0], [b; 0])[..., :N]    [W; 0]: [N', K], N' the next multiple
    inputs: y = linear(pad(x, K' - K), [W 0; 0 0], [b; 0])[..., :N]    when K * itemsize % 16

With an output row stride that is not 16-byte aligned, cuBLAS can only use its
alignment-1 kernels, which run a vocabulary head many times slower than the aligned
GEMM of the padded width; unaligned input rows (an MLP-Mixer's 196 tokens) give
CUTLASS's slow ``align2`` kernels. The zero columns meet zero inputs, so the
sums are the same. The padded weight is a new constant made here, so only the input is
padded at run time (a copy Inductor can fuse into its producer); embedding lookups of a
tied weight read it too (their ids stay under N), so the artifact holds one copy (a
generating build's entry points share it: their weight store is keyed by content). A
tied weight keeps its input width: an embedding row must stay K wide.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import add_constant, attribute, rewrite_and_recapture

_LINEAR = torch.ops.aten.linear.default
_EMBEDDING = torch.ops.aten.embedding.default
_ALIGN_BYTES = 16


class LinearsAlignedByPadding:
    name = "linears_aligned_by_padding"
    required = False
    pad_inputs = False  # the output width only

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_and_recapture(
            program, lambda module: _rewrite_all(module, self.pad_inputs), "linears_padded")


class LinearInputsAlignedByPadding(LinearsAlignedByPadding):
    """A candidate (targets/aoti/cuda.py): the input width padded too, where unaligned."""
    name = "linear_inputs_aligned_by_padding"
    pad_inputs = True


def sliced_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  width: int, extra_inputs: int = 0) -> torch.Tensor:
    """``linear`` over a padded ``weight`` (``extra_inputs`` zero columns last, the input
    padded with as many zeros), keeping the first ``width`` outputs."""
    if extra_inputs:
        x = torch.nn.functional.pad(x, (0, extra_inputs))
    y = torch.nn.functional.linear(x, weight, bias)
    return y if width == weight.shape[0] else y[..., :width]


def _rewrite_all(module: torch.fx.GraphModule, pad_inputs: bool) -> dict:
    padded = 0
    for node in list(module.graph.nodes):
        if node.op != "call_function" or node.target is not _LINEAR:
            continue
        weight = attribute(module, node.args[1])
        bias_node = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        bias = attribute(module, bias_node)
        if not _plain_float_matrix(weight) or (bias_node is not None and bias is None):
            continue
        tied = _tied_embeddings(module, weight)
        width, inputs = weight.shape
        rows = _aligned(width, weight)
        columns = _aligned(inputs, weight) if pad_inputs and not tied else inputs
        if (rows, columns) == (width, inputs):
            continue
        first = next(n for n in module.graph.nodes if n.op != "placeholder")
        new_weight = add_constant(module, f"{node.args[1].target}_padded",
                                  _zero_padded(weight, rows, columns), before=first)
        new_bias = None if bias is None else add_constant(
            module, f"{bias_node.target}_padded", _zero_padded(bias, rows), before=first)
        for embedding in tied:
            embedding.replace_input_with(embedding.args[0], new_weight)
        with module.graph.inserting_before(node):
            replacement = module.graph.call_function(
                sliced_linear, (node.args[0], new_weight, new_bias, width, columns - inputs))
        replacement.meta = dict(node.meta)
        node.replace_all_uses_with(replacement)
        module.graph.erase_node(node)
        padded += 1
    module.recompile()
    return {"linears_padded": padded}


def _zero_padded(value: torch.Tensor, *sizes: int) -> torch.Tensor:
    """``value`` in the first corner of zeros of ``sizes``."""
    out = value.new_zeros(sizes)
    out[tuple(slice(0, n) for n in value.shape)] = value
    return out


def _tied_embeddings(module: torch.fx.GraphModule, weight: torch.Tensor) -> list:
    """Embedding lookups of the same tensor (a tied head): they will read the padded copy."""
    found = []
    for node in module.graph.nodes:
        if node.op != "get_attr" or attribute(module, node) is not weight:
            continue
        found += [user for user in node.users if user.op == "call_function"
                  and user.target is _EMBEDDING and user.args[0] is node]
    return found


def _plain_float_matrix(weight: torch.Tensor | None) -> bool:
    return (weight is not None and type(weight) in (torch.Tensor, torch.nn.Parameter)
            and weight.dtype in (torch.float16, torch.bfloat16, torch.float32)
            and weight.dim() == 2)


def _aligned(size: int, weight: torch.Tensor) -> int:
    """``size`` elements of ``weight``'s type rounded up to whole 16-byte steps."""
    step = _ALIGN_BYTES // weight.element_size()
    return -(-size // step) * step
