"""Graph helpers shared by the quantization passes (PT2E in ``quantize.py``, torchao
weight-only in ``quantize_weight_only.py``): find weighted layers, rewrite weight products
that are not ``aten.linear`` as linears, name layers, count weight bytes, and copy a
module for a pass to rewrite without copying its weights."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from torch.export import ExportedProgram

from passes.graph.rewrite import attribute, module_path
from passes.graph.torch_warnings import loggers_quiet

# Ops whose second argument is a weight a recipe can quantize (ATen names, as captured);
# embedding takes its table first.
WEIGHTED_OPS = {"linear", "conv1d", "conv2d", "conv3d", "addmm", "mm", "matmul", "bmm"}


@contextlib.contextmanager
def quiet_torchao() -> Iterator[None]:
    """torchao logs a warning per CUDA kernel library it cannot load (on a CPU-only
    machine), per missing Triton, and per layer it skips; the report says what matters.
    Quiet while a pass quantizes; the levels are the caller's again after."""
    with loggers_quiet("torchao", "torchao.kernel.intmm"):
        yield


def weighted_op(node: torch.fx.Node) -> tuple[str, object]:
    """(ATen op name, the argument that holds its weight), or ("", None)."""
    op = getattr(node.target, "__name__", "").split(".")[0]
    if node.op != "call_function" or not node.args:
        return "", None
    if op == "embedding":
        return op, node.args[0]
    if op in WEIGHTED_OPS and len(node.args) >= 2:
        return op, node.args[1]
    return "", None


def products_as_linear(module: torch.fx.GraphModule) -> int:
    """Weight products written without ``aten.linear`` become linears, so quantizers
    (which look for linear) see them. Returns how many were rewritten.

    - ``addmm(bias, x, W)``, W [in, out]: Hugging Face GPT-2's ``Conv1D`` layers; PT2E's
      default left them all in float (only ``lm_head`` was quantized). The transposed
      weight is stored as a new attribute.
    - ``x @ W.T`` (matmul of a transposed stored weight): a tied output projection.
    """
    graph, count = module.graph, 0
    for node in list(graph.nodes):
        rewrite = _addmm_operands(module, node) or _matmul_transposed_operands(module, node)
        if rewrite is None:
            continue
        x, weight_node, bias = rewrite
        with graph.inserting_before(node):
            linear = graph.call_function(torch.ops.aten.linear.default, (x, weight_node, bias))
        # Quantizers find linears by source (get_source_partitions): say it is F.linear.
        # "replaced": the per-layer error (passes/quantize/quant_error.py) finds its float twin
        linear.meta = {**node.meta, "source_fn_stack": [(linear.name, torch.nn.functional.linear)],
                       "replaced": node.name}
        linear.meta.pop("torch_fn", None)
        node.replace_all_uses_with(linear)
        graph.erase_node(node)
        count += 1
    if count:
        graph.eliminate_dead_code()  # the orphaned transposes
        module.recompile()
    return count


def label_linears(module: torch.fx.GraphModule) -> None:
    """Say where each ``aten.linear`` came from, where a re-capture forgot. PT2E's X86
    quantizer finds linears by source (``get_source_partitions``), and a graph re-captured
    after a rewrite (merge_linears, any fusion) calls ``aten.linear`` directly, with no
    ``source_fn_stack``: int8-dynamic then left every linear of a decoder in float."""
    for node in module.graph.nodes:
        if node.target is torch.ops.aten.linear.default and not node.meta.get("source_fn_stack"):
            node.meta["source_fn_stack"] = [(node.name, torch.nn.functional.linear)]


_TRANSPOSES = {torch.ops.aten.t.default, torch.ops.aten.numpy_T.default}


def _addmm_operands(module: torch.fx.GraphModule, node: torch.fx.Node):
    if node.op != "call_function" or node.target is not torch.ops.aten.addmm.default \
            or node.kwargs or len(node.args) != 3:
        return None
    bias, x, weight = node.args
    value = attribute(module, weight)
    if value is None or value.dim() != 2:
        return None
    name = f"{weight.target.replace('.', '_')}_as_linear"
    if not hasattr(module, name):
        module.register_parameter(name, torch.nn.Parameter(value.detach().t().contiguous(),
                                                           requires_grad=False))
    with module.graph.inserting_before(node):
        return x, module.graph.get_attr(name), bias


def _matmul_transposed_operands(module: torch.fx.GraphModule, node: torch.fx.Node):
    if node.op != "call_function" or node.target is not torch.ops.aten.matmul.default \
            or node.kwargs or len(node.args) != 2:
        return None
    x, transposed = node.args
    if not (isinstance(transposed, torch.fx.Node) and transposed.target in _TRANSPOSES):
        return None
    value = attribute(module, transposed.args[0])
    if value is None or value.dim() != 2:
        return None
    return x, transposed.args[0], None


def reads_only_weights(node: torch.fx.Node) -> bool:
    """A transposed or reshaped weight (``x @ W.t()``) is still a weight."""
    seen, stack = set(), [node]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if current.op == "placeholder":
            return False
        stack.extend(current.all_input_nodes)
    return True


def layer_name(node: torch.fx.Node) -> str:
    """"model.layers.0.mlp.down_proj:linear_6": the module, then the op's own name."""
    path = module_path(node)
    return f"{path}:{node.name}" if path else node.name


def weight_bytes(program: ExportedProgram) -> int:
    tensors = {id(t): t for t in [*program.state_dict.values(), *program.constants.values()]
               if isinstance(t, torch.Tensor)}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def copy_sharing_weights(module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy whose weights are new tensor objects over the same storage, for a pass
    that swaps weights by assignment and never writes into them (PT2E, torchao's
    weight-only ``quantize_``): a full copy only held the float weights twice (a 1.1B
    decoder: 4.4 GB more, its build went past the machine's memory); an assignment to
    the copy's ``.data`` still cannot reach the user's model."""
    memo: dict[int, torch.Tensor] = {}
    for owner in module.modules():
        for value in [*owner._parameters.values(), *owner._buffers.values(),
                      *owner.__dict__.values()]:
            if isinstance(value, torch.nn.Parameter):
                memo.setdefault(id(value), torch.nn.Parameter(
                    value.detach(), requires_grad=value.requires_grad))
            elif isinstance(value, torch.Tensor):
                memo.setdefault(id(value), value.detach())
    return copy.deepcopy(module, memo)
