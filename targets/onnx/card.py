"""The onnx target's card (targets/card.py): its options, recipes and baseline, and
whether ONNX Runtime is here, without importing torch or the exporter."""

from __future__ import annotations

from pydantic import Field, field_validator

from targets.card import TargetCard, install_command, installed
from targets.errors import TargetOptionError
from targets.onnx.providers import provider_names
from targets.options import TargetOptions

RECIPES = {
    "int8-dynamic": "ONNX Runtime quantize_dynamic: int8 per-channel weights (7-bit range "
                    "for x86, whose CPUs without VNNI saturate 8), activations quantized "
                    "per call (MatMulInteger / ConvInteger)",
    "int8-static": "ONNX Runtime quantize_static: QDQ format, int8 per-channel weights "
                   "(7-bit range for x86) and activations, scales from --calibration "
                   "(MinMax)",
    # ORT's MatMulNBits, as ONNX Runtime GenAI builds its int4/int8 decoders: weights in
    # symmetric blocks (one scale each; the onnx target's --quant-block), activations
    # quantized to int8 inside the kernel (accuracy level 4), the memory-bound decode step
    # reading a quarter / half of fp32's bytes
    "int8-weight": "ONNX Runtime MatMulNBits: 8-bit weights in blocks, int8 activations "
                   "inside the kernel (accuracy level 4); embedding tables int8 in blocks",
    "int4-weight": "ONNX Runtime MatMulNBits: 4-bit weights in blocks, int8 activations "
                   "inside the kernel (accuracy level 4); embedding tables int8 in blocks",
}
# Weights per scale when --quant-block is not given. 4 bits: 128, as AWQ/GPTQ groups and
# the cuda target's int4 (passes/quantize_weight_only.py). 8 bits: 256: ORT's 8-bit kernel
# pays per block (compute-bound on AVX2), 1.1x faster decode than 128 for ~1 dB.
# 32 is llama.cpp's Q4_0/Q8_0 and ONNX Runtime GenAI's default.
NBITS_BLOCK = {"int8-weight": 256, "int4-weight": 128}
NBITS_BLOCKS = (16, 32, 64, 128, 256)  # MatMulNBits takes powers of two from 16
PACKAGES = ("onnx", "onnxscript", "onnxruntime")


class OnnxOptions(TargetOptions):
    ep: str = Field("cpu", description="execution providers in order, e.g. cuda,cpu",
                    examples=["cuda,cpu"])
    quant_block: int | None = Field(None, description="weights per scale for --quantize "
                                    "int8-weight/int4-weight (default 256 at 8 bits, 128 "
                                    "at 4): 32 as llama.cpp's Q4_0 and ONNX Runtime GenAI "
                                    "(slower, a little more exact)", examples=[32],
                                    json_schema_extra={"flag": "--quant-block"})
    own_kernels: bool = Field(True, description="with --quantize int8-weight/int4-weight: "
                              "the GEMVs (norm and SwiGLU folded in) and the decode "
                              "attention on the target's own AVX2 kernels, compiled into "
                              "the artifact (x86-64 with AVX2+FMA; elsewhere ONNX "
                              "Runtime's ops stay); --no-own-kernels keeps ONNX Runtime's")

    def unused_with(self, quantize: str | None) -> list[str]:
        blocks = quantize in ("int8-weight", "int4-weight")
        return [] if blocks else (
            (["--quant-block (blocks of --quantize int8-weight or int4-weight)"]
             if self.quant_block is not None else [])
            + (["--no-own-kernels (kernels of --quantize int8-weight or int4-weight)"]
               if not self.own_kernels else []))

    def block_for(self, recipe: str) -> int | None:
        """Weights per scale of ``recipe``'s MatMulNBits (None: a recipe without blocks)."""
        return self.quant_block or NBITS_BLOCK.get(recipe)

    @field_validator("quant_block")
    @classmethod
    def _block(cls, value: int | None) -> int | None:
        if value is not None and value not in NBITS_BLOCKS:
            raise ValueError(f"ONNX Runtime's MatMulNBits takes blocks of "
                             f"{', '.join(map(str, NBITS_BLOCKS))} weights, not {value}")
        return value

    @field_validator("ep")
    @classmethod
    def _known_providers(cls, value: str) -> str:
        try:
            provider_names(value)
        except TargetOptionError as exc:
            raise ValueError(f"{exc.what}; {exc.hint}") from None
        return value

    @property
    def providers(self) -> list[str]:
        return provider_names(self.ep)


def missing_packages() -> list[str]:
    return [name for name in PACKAGES if not installed(name)]


def onnx_here() -> tuple[bool, str]:
    missing = missing_packages()
    if missing:
        return False, f"{', '.join(missing)} not installed; run {install_command('onnx')}"
    import onnxruntime
    return True, (f"onnxruntime {onnxruntime.__version__}; providers here: "
                  f"{', '.join(onnxruntime.get_available_providers())}")


# constant-folding chatter; onnx_ir types each empty list attribute as INTS, a line each
LOGGERS_TO_QUIET = ("onnxscript", "onnx_ir")

ONNX = TargetCard("onnx", "cpu", "onnxruntime", "ONNX model per partition (torch.onnx "
                  "dynamo exporter), run by ONNX Runtime", OnnxOptions, tuple(RECIPES),
                  baselines=("onnxruntime",), check=onnx_here,
                  loggers_to_quiet=LOGGERS_TO_QUIET)
