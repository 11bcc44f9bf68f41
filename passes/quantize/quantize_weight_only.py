"""Weight-only quantization with torchao's tensor subclasses (``int8-weight``,
``int4-weight``): linear weights are stored in int8 / grouped int4, activations stay
float, so the gain is memory traffic (GPU, memory-bound decoders), not int8 math.

    before: linear(x, w: f32 [out, in])
    after:  mm(x, dequant(w: int8 per row))                      int8-weight
            _weight_int4pack_mm(x.bf16, w: int4 tiles, scales per group of 128/64/32)
                                                              int4-weight (CUDA)
            _weight_int4pack_mm_for_cpu(x.bf16, w: int4, groups of 32)
                                                              int4-weight (CPU: int4_cpu.py)

A target may give its own torchao config per layer (``Quantization.layer_config``):
executorch's int4-weight also quantizes activations per call (8da4w, XNNPACK's kernels);
or its own format for linears (``Quantization.linear_formats``): cuda's int4-weight is int4
rows its decode kernels read (targets/aoti/kernels/int4_rows.py).

torchao quantizes modules (``quantize_``), not graphs, so each linear's weight is
quantized through a throwaway ``nn.Linear`` holding it, put back into the captured
graph, and the graph calls ``F.linear`` (which the subclass intercepts) instead of
``aten.linear``. Re-capture then traces through the subclass, and
``run_decompositions`` leaves plain tensors (int8 data, scales) as the program's weights,
so partitioning, safetensors and AOTInductor see ordinary parameters.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import attribute, drop_unused_weights, recapture
from passes.quantize import int4_cpu
from passes.quantize.quant_error import layer_error_record
from passes.quantize.quant_graph import (copy_sharing_weights, layer_name, products_as_linear,
                                         quiet_torchao, weight_bytes, weighted_op)
from runtime.program.flat_inputs import flatten_inputs

# The layers each recipe quantizes, with the functional form the torchao tensor
# intercepts. Int8 also takes embedding tables (gathered rows are dequantized); torchao's
# int4 tinygemm layout has no embedding, so int4-weight stores tables as int8 (_swapper).
_FUNCTIONAL = {
    "int8-weight": {"linear": torch.nn.functional.linear,
                    "embedding": torch.nn.functional.embedding},
    "int4-weight": {"linear": torch.nn.functional.linear},
}


# int4 groups, largest first: a group shares one scale, so larger is smaller and less
# exact; torchao skips a layer whose in_features its group does not divide.
INT4_GROUPS = (128, 64, 32)


# A target's own torchao config for a recipe's layers (``Quantization.layer_config``):
# (recipe, in_features) -> (config, the dtype its format packs from), or why it stays float.
Configure = Callable[[str, int], "tuple[object, torch.dtype | None] | str"]
# A target's own swap of a linear's weight for its format (module, node, op, weight node)
# -> None when swapped, else why the layer stays float (the cuda target's int4 rows).
Swap = Callable[[torch.fx.GraphModule, torch.fx.Node, str, object], "str | None"]


def torchao_config(recipe: str, in_features: int) -> tuple[object, torch.dtype | None] | str:
    """torchao's config for a weight-only recipe and one layer, and the dtype its format
    packs from; the reason when the recipe cannot take a layer this wide."""
    from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig
    if recipe == "int8-weight":
        return Int8WeightOnlyConfig(), None
    if recipe == "int4-weight":
        group = next((g for g in INT4_GROUPS if in_features % g == 0), None)
        if group is None:
            return (f"in_features {in_features} is not a multiple of an int4 group "
                    f"({', '.join(map(str, INT4_GROUPS))})")
        # tinygemm's layout (aten._weight_int4pack_mm, in torch itself); torchao's default
        # "plain" int4 needs the separate mslk/fbgemm kernels, which devices rarely have.
        return Int4WeightOnlyConfig(group_size=group,
                                    int4_packing_format="tile_packed_to_4d"), torch.bfloat16
    raise ValueError(f"not a weight-only recipe: {recipe}")


class QuantizeWeightOnly:
    name = "quantize"
    required = True  # the user asked for it: a failure fails the build
    recipes = tuple(_FUNCTIONAL)

    def __init__(self, recipe: str, how: str, device: str,
                 configure: Configure | None = None, swap_linear: Swap | None = None,
                 layout: str = "") -> None:
        self.recipe, self.how, self.device = recipe, how, device
        self.configure = configure  # the target's own layer config, or the shared one
        self.swap_linear = swap_linear  # the target's own linear format (cuda int4 rows)
        self.layout = layout  # its weights' layout, recorded with the figures

    def __call__(self, program: ExportedProgram) -> PassResult:
        before = weight_bytes(program)
        module = copy_sharing_weights(program.module())  # the user's keeps its own
        rewritten = products_as_linear(module)
        quantized, in_float = quantize_weights(module, self.recipe, device=self.device,
                                               configure=self.configure,
                                               swap_linear=self.swap_linear)
        errors = layer_error_record(program.module(), module, quantized,
                                    [flatten_inputs(*program.example_inputs).tensors],
                                    "the example inputs")
        drop_unused_weights(module)
        recaptured = recapture(module, program).run_decompositions({})
        info = {"recipe": self.recipe, "how": self.how, "calibration_sets": 0,
                "rewritten_as_linear": rewritten, "layers_quantized": quantized,
                "layers_float": in_float, "weight_bytes_before": before,
                "weight_bytes_after": weight_bytes(recaptured), **errors}
        if self.layout:
            info["layout"] = self.layout
        return PassResult(recaptured, modified=bool(quantized), info=info)


@quiet_torchao()
def quantize_weights(module: torch.fx.GraphModule, recipe: str,
                     only: set[str] | None = None,
                     device: str = "", configure: Configure | None = None,
                     swap_linear: Swap | None = None) -> tuple[list[str], list[dict]]:
    """Swap the weights of the recipe's layers (of ``only`` these ops, if given) for
    torchao's quantized tensors, in place (int4 on ``device`` "cpu": ATen's CPU format,
    int4_cpu.py, with int8 embedding tables; ``configure``: a target's own config for
    the layers instead; ``swap_linear``: a target's own format for its linears); the
    caller re-captures (then ``run_decompositions``). Returns
    the layers quantized and those left in float, why."""
    quantized, in_float = [], []
    for node in list(module.graph.nodes):
        op, weight = weighted_op(node)
        if not op or (only is not None and op not in only):
            continue
        if attribute(module, weight) is None and op != "linear":
            continue  # activation x activation (attention scores): not a layer
        swap = swap_linear if swap_linear is not None and op == "linear" else \
            _swapper(recipe, device, op, configure)
        why = swap(module, node, op, weight)
        if why is None:
            quantized.append(layer_name(node))
        else:
            in_float.append({"layer": layer_name(node), "op": op, "why": why})
    module.recompile()
    return quantized, in_float


def _swapper(recipe: str, device: str, op: str, configure: Configure | None) -> Callable:
    """How one layer's weight is swapped: int4-weight's embedding tables go to int8 rows
    on every device (only the gathered rows are dequantized; a 32k-token vocabulary's
    float table was 45% of a 300M decoder's int4 artifact), its linears to ATen's CPU int4
    layout on cpu; torchao's tensors otherwise (the target's ``configure``'s, if given)."""
    if recipe == "int4-weight" and op == "embedding":
        return functools.partial(_swap_weight, recipe="int8-weight")
    if configure is not None:
        return functools.partial(_swap_weight, recipe=recipe, configure=configure)
    if recipe == "int4-weight" and device == "cpu":
        return _swap_for_cpu_int4
    return functools.partial(_swap_weight, recipe=recipe)


def _swap_weight(module: torch.fx.GraphModule, node: torch.fx.Node, op: str,
                 weight_node: object, recipe: str,
                 configure: Configure = torchao_config) -> str | None:
    """Swap one layer's weight for torchao's quantized tensor; None when done, else why
    it stays float."""
    if op not in _FUNCTIONAL[recipe]:
        return f"{recipe} quantizes {' and '.join(_FUNCTIONAL[recipe])} layers"
    weight = attribute(module, weight_node)
    if weight is None:
        return "its weight is computed in the graph, not a stored tensor"
    if weight.dim() != 2:
        return f"its weight has {weight.dim()} dims"
    # A fresh name per weight, so a table tied to an output projection (GPT-2's wte and
    # lm_head, both per row) is quantized once and stored once.
    name = f"{weight_node.target.replace('.', '_')}_{recipe.replace('-', '_')}"
    if not hasattr(module, name):
        why = _quantized_copy(module, name, weight, recipe, configure)
        if why:
            return why
    with module.graph.inserting_before(node):
        quantized = module.graph.get_attr(name)
    # The subclass intercepts the functional form, not the ATen op.
    node.target = _FUNCTIONAL[recipe][op]
    node.args = ((node.args[0], quantized, *node.args[2:]) if op == "linear"
                 else (node.args[1], quantized))  # aten.embedding(weight, indices)
    return None


def _quantized_copy(module: torch.fx.GraphModule, name: str, weight: torch.Tensor,
                    recipe: str, configure: Configure) -> str | None:
    from torchao.quantization import quantize_

    made = configure(recipe, weight.shape[1])
    if isinstance(made, str):
        return made
    config, pack_dtype = made
    # An embedding table [rows, dim] is quantized like a linear weight [out, in]: per row.
    holder = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False,
                             device=weight.device, dtype=pack_dtype or weight.dtype)
    holder.weight = torch.nn.Parameter(weight.detach().to(holder.weight.dtype),
                                       requires_grad=False)
    try:
        quantize_(holder, config)
    except (RuntimeError, AssertionError, ValueError, NotImplementedError) as exc:
        # torchao's formats assert on shapes and devices they cannot pack
        return f"torchao could not quantize it: {str(exc).splitlines()[0][:160]}"
    if type(holder.weight.data) is torch.Tensor:  # torchao skips with a log line only
        return "torchao left it unquantized (its log says why)"
    module.register_parameter(name, holder.weight)
    return None


def _swap_for_cpu_int4(module: torch.fx.GraphModule, node: torch.fx.Node, op: str,
                       weight_node: object) -> str | None:
    """Like ``_swap_weight``, for ATen's CPU int4 layout: two stored tensors (packed values,
    scales and zeros) and a call of ``int4_cpu.linear`` in place of the linear."""
    if op != "linear":
        return "int4-weight quantizes linear layers"
    weight = attribute(module, weight_node)
    if weight is None:
        return "its weight is computed in the graph, not a stored tensor"
    name = f"{weight_node.target.replace('.', '_')}_int4_cpu"
    if not hasattr(module, f"{name}_packed"):
        packed = int4_cpu.pack(weight)
        if isinstance(packed, str):
            return packed
        module.register_buffer(f"{name}_packed", packed[0])
        module.register_buffer(f"{name}_scales", packed[1])
    with module.graph.inserting_before(node):
        stored = [module.graph.get_attr(f"{name}_{part}") for part in ("packed", "scales")]
    bias = node.args[2] if len(node.args) > 2 else None
    node.target = int4_cpu.linear
    node.args = (node.args[0], *stored, weight.shape[0], bias)
    return None
