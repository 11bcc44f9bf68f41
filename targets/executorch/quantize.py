"""The executorch target's ``--quantize`` recipes: PT2E with ExecuTorch's own
XNNPACKQuantizer, whose annotations are the quantize/dequantize patterns XNNPACK's
partitioner takes into its delegate (int8 convolutions, linears, adds, ...).

    before: linear(x, w: f32)
    after:  linear(dq(q(x)), dq(w: int8 per channel))   -> one XNNPACK qd8/qs8 linear

The flow (prepare, calibrate, convert, re-capture) is passes/quantize/quantize.py's, as on
every PT2E target; only the quantizer is ExecuTorch's.
"""

from __future__ import annotations

from targets.facets import Quantization

RECIPES = {
    "int8-static": "PT2E, ExecuTorch's XNNPACKQuantizer (symmetric, static): int8 "
                   "per-channel weights, activation scales from --calibration; lowered "
                   "into XNNPACK's int8 kernels",
    "int8-dynamic": "PT2E, ExecuTorch's XNNPACKQuantizer (symmetric, dynamic): int8 "
                    "per-channel weights for linears and for convolutions without a ReLU "
                    "after them (its conv_relu pattern is static only), activations "
                    "quantized per call (XNNPACK's qd8 kernels)",
}


class XnnpackQuantization(Quantization):
    def quantizer(self, recipe: str) -> object:
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )
        config = get_symmetric_quantization_config(is_per_channel=True,
                                                   is_dynamic=recipe == "int8-dynamic")
        return XNNPACKQuantizer().set_global(config)
