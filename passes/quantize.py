"""Quantize a program with torchao's PT2E flow: prepare, calibrate, convert, re-capture.

The quantizer comes from the target (X86InductorQuantizer for ``cpu``), so each
target decides which recipe it can run; this pass only drives the flow and reports:
layers quantized, layers left in float (with why), weight bytes before and after.

    before: linear(x, w: f32)
    after:  linear(dq(q(x)), dq(w: int8 per channel))   -> Inductor fuses into an int8 GEMM

Run after dead-code cleanup: ``prepare_pt2e`` failed with a bare ``IndexError`` on an
unused pooler left behind by outputs the caller drops.
"""

from __future__ import annotations

import copy
import logging
from typing import Callable, Sequence

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.dims import dynamic_shapes_for
from runtime.flat_inputs import FlatInputs, flatten_inputs

# Ops whose second argument is a weight a recipe can quantize (ATen names, as captured).
WEIGHTED_OPS = {"linear", "conv1d", "conv2d", "conv3d", "addmm", "mm", "matmul", "bmm"}
_DEQUANTIZE = ("dequantize_per_channel", "dequantize_per_tensor", "dequantize_affine")


class _FlatCall(torch.nn.Module):
    """The captured module called with flat tensors, as the program takes them."""

    def __init__(self, inner: torch.nn.Module, inputs: FlatInputs) -> None:
        super().__init__()
        self.inner, self.inputs = inner, inputs

    def forward(self, *flat: torch.Tensor):
        args, kwargs = self.inputs.rebuild(list(flat))
        return self.inner(*args, **kwargs)


class QuantizePT2E:
    name = "quantize"

    def __init__(self, recipe: str, make_quantizer: Callable[[], object],
                 calibration: Sequence[Sequence[torch.Tensor]], how: str) -> None:
        self.recipe, self.make_quantizer, self.how = recipe, make_quantizer, how
        self.calibration = list(calibration)  # flat input sets; [] for dynamic recipes

    def __call__(self, program: ExportedProgram) -> PassResult:
        # torchao logs a warning per CUDA kernel library it cannot load (on a CPU-only
        # machine) or per missing Triton; PT2E uses none of them.
        for name in ("torchao", "torchao.kernel.intmm"):
            logging.getLogger(name).setLevel(logging.ERROR)
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        inputs = flatten_inputs(*program.example_inputs)
        before = _weight_bytes(program)
        # A copy: program.module() shares its parameters with the user's model, which
        # eager validation still needs in float32.
        module = copy.deepcopy(program.module())
        rewritten = _addmm_as_linear(module)
        prepared = prepare_pt2e(module, self.make_quantizer())
        with torch.no_grad():
            for flat in self.calibration or [inputs.tensors]:
                args, kwargs = inputs.rebuild(list(flat))
                prepared(*args, **kwargs)
        converted = convert_pt2e(prepared)
        _drop_unused_weights(converted)
        quantized, in_float = _layers(converted)
        user_inputs = [n for n in program.graph.nodes if n.op == "placeholder"
                       and n.name in program.graph_signature.user_inputs]
        recaptured = torch.export.export(
            _FlatCall(converted, inputs), tuple(inputs.tensors),
            dynamic_shapes=(dynamic_shapes_for(user_inputs, program),), strict=False)
        info = {"recipe": self.recipe, "how": self.how,
                "calibration_sets": len(self.calibration), "addmm_as_linear": rewritten,
                "layers_quantized": quantized, "layers_float": in_float,
                "weight_bytes_before": before, "weight_bytes_after": _weight_bytes(recaptured)}
        return PassResult(recaptured, modified=bool(quantized), info=info)


def _addmm_as_linear(module: torch.fx.GraphModule) -> int:
    """``addmm(bias, x, W)`` with a weight ``W`` [in, out] becomes ``linear(x, W.T, bias)``.

    PT2E quantizers annotate ``aten.linear``; Hugging Face's GPT-2 writes its layers as
    ``Conv1D``, an addmm, and PT2E's default left them all in float (only ``lm_head`` was
    quantized). The transposed weight is stored as a new attribute, so the quantizer sees
    a plain weight. Returns how many were rewritten."""
    graph, count = module.graph, 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.addmm.default \
                or node.kwargs or len(node.args) != 3:
            continue
        bias, x, weight = node.args
        if not (isinstance(weight, torch.fx.Node) and weight.op == "get_attr"):
            continue
        owner, _, attr = weight.target.rpartition(".")
        value = getattr(module.get_submodule(owner) if owner else module, attr, None)
        if not isinstance(value, torch.Tensor) or value.dim() != 2:
            continue
        name = f"{weight.target.replace('.', '_')}_as_linear"
        module.register_parameter(name, torch.nn.Parameter(value.detach().t().contiguous(),
                                                           requires_grad=False))
        with graph.inserting_before(node):
            linear_weight = graph.get_attr(name)
            linear = graph.call_function(torch.ops.aten.linear.default, (x, linear_weight, bias))
        # Quantizers find linears by source (get_source_partitions): say it is F.linear.
        linear.meta = {**node.meta, "source_fn_stack": [(linear.name, torch.nn.functional.linear)]}
        linear.meta.pop("torch_fn", None)
        node.replace_all_uses_with(linear)
        graph.erase_node(node)
        count += 1
    if count:
        module.recompile()
    return count


def _drop_unused_weights(module: torch.fx.GraphModule) -> None:
    """convert_pt2e folds each quantized weight into a new int8 attribute and leaves the
    float32 original registered; re-capture would carry both into the artifact."""
    module.graph.eliminate_dead_code()
    module.recompile()
    used = {n.target for n in module.graph.nodes if n.op == "get_attr"}
    for name, _ in [*module.named_parameters(), *module.named_buffers()]:
        if name not in used:
            owner_path, _, attr = name.rpartition(".")
            delattr(module.get_submodule(owner_path) if owner_path else module, attr)


def _layers(module: torch.fx.GraphModule) -> tuple[list[str], list[dict]]:
    """Weighted ops by whether their weight now comes out of a dequantize node."""
    quantized, in_float = [], []
    for node in module.graph.nodes:
        op = getattr(node.target, "__name__", "").split(".")[0]
        if node.op != "call_function" or op not in WEIGHTED_OPS or len(node.args) < 2:
            continue
        weight = node.args[1]
        where = _layer_name(node)
        if not isinstance(weight, torch.fx.Node):
            continue
        producer = getattr(weight.target, "__name__", "")
        if producer.startswith(_DEQUANTIZE):
            quantized.append(where)
        elif weight.op == "get_attr" or _reads_only_weights(weight):
            in_float.append({"layer": where, "op": op,
                             "why": "the recipe's quantizer left it unannotated"})
        # an activation x activation product (attention scores) is not a weighted layer
    return quantized, in_float


def _reads_only_weights(node: torch.fx.Node) -> bool:
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


def _layer_name(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    path = list(stack.values())[-1][0] if stack else ""
    return f"{path}:{node.name}" if path else node.name


def _weight_bytes(program: ExportedProgram) -> int:
    tensors = {id(t): t for t in [*program.state_dict.values(), *program.constants.values()]
               if isinstance(t, torch.Tensor)}
    return sum(t.numel() * t.element_size() for t in tensors.values())
