"""The executorch target's ``--quantize`` recipes.

int8-static / int8-dynamic: PT2E with ExecuTorch's own XNNPACKQuantizer, whose
annotations are the quantize/dequantize patterns XNNPACK's partitioner takes into its
delegate (int8 convolutions, linears, adds, ...; int8-dynamic: linears only). The flow (prepare, calibrate, convert,
re-capture) is passes/quantize/quantize.py's, as on every PT2E target.

    before: linear(x, w: f32)
    after:  linear(dq(q(x)), dq(w: int8 per channel))   -> one XNNPACK qd8/qs8 linear

int4-weight: 8-bit activations, 4-bit weights (``8da4w``, ExecuTorch's LLM recipe):
torchao's Int8DynamicActivationIntxWeightConfig through the tensor-subclass flow
(passes/quantize/quantize_weight_only.py), lowered into XNNPACK's qd8-qb4w linears.

    after:  linear(dq(q(x, choose_qparams(x))), dq(w: int4 in groups of 32))
"""

from __future__ import annotations

import torch

from passes.quantize.quantize_weight_only import Configure
from targets.facets import Quantization

# ExecuTorch's LLM export's 8da4w default group: XNNPACK's blockwise int4 kernels take
# groups that divide in_features (and are multiples of 32).
INT4_GROUP = 32

RECIPES = {
    "int8-static": "PT2E, ExecuTorch's XNNPACKQuantizer (symmetric, static): int8 "
                   "per-channel weights, activation scales from --calibration; lowered "
                   "into XNNPACK's int8 kernels; embeddings int8 per row (ExecuTorch's "
                   "embedding_byte kernel)",
    "int8-dynamic": "PT2E, ExecuTorch's XNNPACKQuantizer (symmetric, dynamic): int8 "
                    "per-channel weights for linears, activations quantized per call "
                    "(XNNPACK's qd8 kernels); convolutions stay float (XNNPACK's "
                    "dynamically quantized convolutions fail at execute in ExecuTorch "
                    "1.5); embeddings int8 per row (ExecuTorch's embedding_byte kernel)",
    "int4-weight": "8-bit activations, 4-bit weights (8da4w, as ExecuTorch's LLM export): "
                   f"torchao Int8DynamicActivationIntxWeightConfig, int4 linear weights "
                   f"in symmetric groups of {INT4_GROUP}, activations int8 per token per "
                   "call, lowered into XNNPACK's qd8-qb4w kernels; embeddings int8 per "
                   "row (ExecuTorch's embedding_byte kernel)",
}


class XnnpackQuantization(Quantization):
    def quantizer(self, recipe: str) -> object:
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            get_symmetric_quantization_config,
        )
        dynamic = recipe == "int8-dynamic"
        config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic)
        if dynamic:  # linears only: a qd8 convolution's delegate failed at execute
            return _float_scalars_quantizer().set_operator_type(
                torch.ops.aten.linear.default, config)
        return _float_scalars_quantizer().set_global(config)

    def layer_config(self, recipe: str) -> Configure | None:
        return int8_activation_int4_weight if recipe == "int4-weight" else None


def _float_scalars_quantizer() -> object:
    """ExecuTorch's XNNPACKQuantizer, whose scalars-to-tensors step keeps integer maths.

    Its ``transform_for_annotation`` stores every scalar of an add or mul as a float32
    tensor, so that the quantizer can observe it; on integer arithmetic that changes the
    result's dtype: Hugging Face's attention mask computes ``arange(n) + 0`` and indexes
    with it, and calibration failed ("tensors used as indices must be long ..."). Scalars
    of ops whose result is not floating point stay scalars (nothing there is quantized).

        before: add(arange: i64, 0)  ->  add(arange, _tensor_constant_0: f32) -> f32
        after:  add(arange: i64, 0)  ->  i64
    """
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer

    class FloatScalarsXNNPACKQuantizer(XNNPACKQuantizer):
        def transform_for_annotation(self, model: torch.fx.GraphModule
                                     ) -> torch.fx.GraphModule:
            kept = {node: node.args for node in model.graph.nodes
                    if node.op == "call_function" and not _floating(node)}
            model = super().transform_for_annotation(model)
            for node, args in kept.items():
                if node.args != args:
                    _restore_args(model, node, args)
            model.recompile()
            return model

    return FloatScalarsXNNPACKQuantizer()


def _floating(node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.dtype.is_floating_point


def _restore_args(model: torch.fx.GraphModule, node: torch.fx.Node, args: tuple) -> None:
    """Put back ``node``'s scalar arguments; drop the tensors made of them."""
    made = [a for a in node.args if isinstance(a, torch.fx.Node) and a not in args]
    node.args = args
    for attr in made:
        if attr.op == "get_attr" and not attr.users:
            model.graph.erase_node(attr)
            delattr(model, attr.target)


def int8_activation_int4_weight(recipe: str, in_features: int
                                ) -> tuple[object, None] | str:
    """torchao's 8da4w config for a linear ``in_features`` wide, or why it stays float."""
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig
    from torchao.quantization.granularity import PerGroup
    if in_features % INT4_GROUP:
        return (f"in_features {in_features} is not a multiple of the int4 group "
                f"({INT4_GROUP}, XNNPACK's blockwise int4 kernels)")
    return Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int4, weight_granularity=PerGroup(INT4_GROUP)), None
