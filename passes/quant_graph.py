"""Graph helpers shared by the quantization passes (PT2E in ``quantize.py``, torchao
weight-only in ``quantize_weight_only.py``): call the captured module with flat inputs,
re-capture it with the program's dynamic dims, rewrite GPT-2's addmm layers as linears,
drop orphaned float weights, name layers and count weight bytes."""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.dims import dynamic_shapes_for
from runtime.flat_inputs import FlatInputs, flatten_inputs

# Ops whose second argument is a weight a recipe can quantize (ATen names, as captured);
# embedding takes its table first.
WEIGHTED_OPS = {"linear", "conv1d", "conv2d", "conv3d", "addmm", "mm", "matmul", "bmm"}


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


class _FlatCall(torch.nn.Module):
    """The captured module called with flat tensors, as the program takes them."""

    def __init__(self, inner: torch.nn.Module, inputs: FlatInputs) -> None:
        super().__init__()
        self.inner, self.inputs = inner, inputs

    def forward(self, *flat: torch.Tensor):
        args, kwargs = self.inputs.rebuild(list(flat))
        return self.inner(*args, **kwargs)


def recapture(module: torch.nn.Module, program: ExportedProgram) -> ExportedProgram:
    """Export ``module`` (a rewritten ``program.module()``) with the program's flat
    inputs and the same dynamic dims."""
    inputs = flatten_inputs(*program.example_inputs)
    user_inputs = [n for n in program.graph.nodes if n.op == "placeholder"
                   and n.name in program.graph_signature.user_inputs]
    return torch.export.export(
        _FlatCall(module, inputs), tuple(inputs.tensors),
        dynamic_shapes=(dynamic_shapes_for(user_inputs, program),), strict=False)


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
        linear.meta = {**node.meta, "source_fn_stack": [(linear.name, torch.nn.functional.linear)]}
        linear.meta.pop("torch_fn", None)
        node.replace_all_uses_with(linear)
        graph.erase_node(node)
        count += 1
    if count:
        graph.eliminate_dead_code()  # the orphaned transposes
        module.recompile()
    return count


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


def attribute(module: torch.fx.GraphModule, node: object) -> torch.Tensor | None:
    """The tensor a ``get_attr`` node reads, or None for anything else."""
    if not (isinstance(node, torch.fx.Node) and node.op == "get_attr"):
        return None
    owner, _, attr = node.target.rpartition(".")
    value = getattr(module.get_submodule(owner) if owner else module, attr, None)
    return value if isinstance(value, torch.Tensor) else None


def drop_unused_weights(module: torch.fx.GraphModule) -> None:
    """A rewrite that replaces a weight (convert_pt2e's int8 copy, addmm's transposed
    one) leaves the float original registered; re-capture would carry both."""
    module.graph.eliminate_dead_code()
    module.recompile()
    used = {n.target for n in module.graph.nodes if n.op == "get_attr"}
    # remove_duplicate=False: a tied weight (GPT-2's wte and lm_head) has two names, and
    # the unused one would otherwise stay and be exported in float.
    for name, _ in [*module.named_parameters(remove_duplicate=False),
                    *module.named_buffers(remove_duplicate=False)]:
        if name not in used:
            owner_path, _, attr = name.rpartition(".")
            delattr(module.get_submodule(owner_path) if owner_path else module, attr)


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
    stack = node.meta.get("nn_module_stack") or {}
    path = list(stack.values())[-1][0] if stack else ""
    return f"{path}:{node.name}" if path else node.name


def weight_bytes(program: ExportedProgram) -> int:
    tensors = {id(t): t for t in [*program.state_dict.values(), *program.constants.values()]
               if isinstance(t, torch.Tensor)}
    return sum(t.numel() * t.element_size() for t in tensors.values())
