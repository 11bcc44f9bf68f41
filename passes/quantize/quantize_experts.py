"""--quantize for the experts of a mixture-of-experts layer, on every target.

transformers' MoE layers (Mixtral, Qwen-MoE, OLMoE, gpt-oss, DeepSeek, ...) call their
experts as ``transformers::grouped_mm_fallback(rows, weight [E, in, out], offs)``, an op
no target translates, so it runs on the CPU fallback, where neither the PT2E/torchao
passes nor ONNX Runtime's quantizer reach: an "int4" Mixtral kept ~95% of its weights in
float32. Here each such call whose weight is a stored tensor (possibly through a
transpose, which transformers applies to [E, out, in] experts) becomes the runtime's
``edge_exporter::grouped_mm_int8`` or ``grouped_mm_int4`` over the quantized experts
(runtime/generation/experts_op.py: the kernels and the formats). Recipes with int4
weights get int4 experts; every other recipe int8 experts, weight-only: the activations
of an expert matmul stay float whatever the recipe does to the linears (said in the
report's ``how``).
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.quantize.quantize_weight_only import INT4_GROUPS
from passes.graph.rewrite import (add_constant, attribute, drop_unused_weights, module_path,
                                  recapture)
from runtime.generation import experts_op

# the views transformers puts between a stored expert weight and the grouped matmul
_VIEWS = {torch.ops.aten.transpose.int, torch.ops.aten.permute.default,
          torch.ops.aten.t.default, torch.ops.aten.contiguous.default,
          torch.ops.aten.clone.default, torch.ops.aten.alias.default}


def experts_calls(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    op = _experts_op()
    return [] if op is None else [n for n in graph.nodes
                                  if n.op == "call_function" and n.target is op]


def _experts_op():
    namespace = getattr(torch.ops, "transformers", None)
    packet = getattr(namespace, "grouped_mm_fallback", None) if namespace else None
    return getattr(packet, "default", None) if packet is not None else None


class QuantizeExperts:
    name = "quantize_experts"
    required = True  # the user asked for --quantize: a failure fails the build

    def __init__(self, recipe: str) -> None:
        self.recipe = recipe
        self.bits = 4 if recipe.startswith("int4") else 8

    def __call__(self, program: ExportedProgram) -> PassResult:
        if not experts_calls(program.graph):
            return PassResult(program, modified=False, info={})
        module = program.module()
        quantized, in_float = [], []
        self.bytes = [0, 0]  # the experts' weights before and after
        for node in experts_calls(module.graph):
            why = self._swap(module, node)
            label = f"{module_path(node) or 'experts'}:{node.name}"
            if why is None:
                quantized.append(label)
            else:
                in_float.append({"layer": label, "op": "grouped_mm_fallback", "why": why})
        if not quantized:
            return PassResult(program, modified=False, info={})
        drop_unused_weights(module)
        recaptured = recapture(module, program)
        how = (f"int{self.bits} expert weights ("
               + ("symmetric groups along the input" if self.bits == 4 else
                  "symmetric, per expert and output column")
               + "), dequantized per routed expert on the CPU fallback; activations float")
        return PassResult(recaptured, modified=True, info={
            "recipe": self.recipe, "how": how, "layers_quantized": quantized,
            "layers_float": in_float, "weight_bytes_before": self.bytes[0],
            "weight_bytes_after": self.bytes[1]})

    def _swap(self, module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        rows, weight_arg, offs = node.args[:3]
        weight = stored_weight(module, weight_arg)
        if weight is None:
            return "its weight is computed in the graph, not a stored tensor"
        if weight.dim() != 3 or not weight.is_floating_point():
            return f"its weight is {weight.dim()}-D {weight.dtype}, not [experts, in, out]"
        if self.bits == 4:
            group = next((g for g in INT4_GROUPS if weight.shape[1] % g == 0), None)
            if group is None:
                return (f"in_features {weight.shape[1]} is not a multiple of an int4 group "
                        f"({', '.join(map(str, INT4_GROUPS))})")
            values, scale = quantize_int4(weight, group)
        else:
            values, scale = quantize_int8(weight)
        ops = getattr(torch.ops, experts_op.OP_NAMESPACE)  # registered by the import
        op = (ops.grouped_mm_int4 if self.bits == 4 else ops.grouped_mm_int8).default
        self.bytes[0] += _nbytes(weight)
        self.bytes[1] += _nbytes(values) + _nbytes(scale)
        stem = f"{module_path(node) or 'experts'}.{node.name}"
        stored = [add_constant(module, f"{stem}_q{self.bits}", values, node),
                  add_constant(module, f"{stem}_scale", scale, node)]
        node.target = op
        node.args = (rows, *stored, offs)
        node.kwargs = {}
        return None


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def stored_weight(module: torch.fx.GraphModule, node: object) -> torch.Tensor | None:
    """The tensor a chain of views over one ``get_attr`` computes, or None."""
    chain = []
    while isinstance(node, torch.fx.Node) and node.op == "call_function" \
            and node.target in _VIEWS:
        chain.append(node)
        node = node.args[0]
    value = attribute(module, node)
    if value is None:
        return None
    for view in reversed(chain):
        value = view.target(value, *view.args[1:], **view.kwargs)
    return value.detach().contiguous()


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, in, out] -> int8 values, scale [E, 1, out] (float32)."""
    w = weight.float()
    scale = (w.abs().amax(dim=1, keepdim=True) / 127).clamp(min=torch.finfo(torch.float32).tiny)
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale


def quantize_int4(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, in, out] -> packed uint8 [E, in/G, G/2, out], scale [E, in/G, 1, out]."""
    experts, inputs, outputs = weight.shape
    w = weight.float().reshape(experts, inputs // group, group, outputs)
    scale = (w.abs().amax(dim=2, keepdim=True) / 7).clamp(min=torch.finfo(torch.float32).tiny)
    values = (torch.round(w / scale).clamp(-8, 7) + 8).to(torch.uint8)
    packed = values[:, :, 0::2] | (values[:, :, 1::2] << 4)
    return packed, scale

