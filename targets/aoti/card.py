"""The cards of ``cpu`` and ``cuda`` (targets/card.py): their options and recipes, and
whether they work here, without importing torch where the answer needs none."""

from __future__ import annotations

import importlib.metadata
import os
from typing import Literal

from pydantic import Field, field_validator

from targets.card import TargetCard
from targets.options import TargetOptions
from targets.toolchain import choose_cxx


class AotiOptions(TargetOptions):
    autotune: bool = Field(False, description="Inductor max-autotune (slow)")
    compile_timeout_s: int = Field(1800, ge=0, description="seconds one C++ compiler run "
                                   "may take (0: no limit)",
                                   json_schema_extra={"flag": "--compile-timeout"})

    def measured_choices(self) -> list[str]:
        return ["--autotune"] if self.autotune else []


# The cpu target's backends a partition may run on (targets/aoti/choice.py); "auto" times
# each that builds and keeps the fastest. The variable pins one where no option is given.
CPU_BACKENDS = ("aoti", "aoti-onednn", "onnx")
CPU_BACKEND_ENV = "EDGE_EXPORTER_CPU_BACKEND"


class CpuOptions(AotiOptions):
    cpu_backend: Literal["auto", "aoti", "aoti-onednn", "onnx"] | None = Field(
        None, examples=["onnx"], validate_default=True,
        description="the backend of each partition: auto times every one that builds "
                    f"and keeps the fastest; aoti, aoti-onednn (Inductor's oneDNN "
                    f"packing of float32 linears) or onnx pins one (default: "
                    f"${CPU_BACKEND_ENV}, else auto)")

    @field_validator("cpu_backend")
    @classmethod
    def _a_known_pin_in_the_environment(cls, value: str | None) -> str | None:
        if value is None:
            pinned_by_environment()  # refused with the settings, before any work
        return value

    def unused_with(self, quantize: str | None) -> list[str]:
        if quantize and self.cpu_backend == "onnx":
            return [f"--cpu-backend onnx (float builds: cpu's --quantize {quantize} runs "
                    "through Inductor; --target onnx has ONNX Runtime's recipes)"]
        return []


def pinned_by_environment() -> str | None:
    """The backend EDGE_EXPORTER_CPU_BACKEND pins; None where it is unset or empty."""
    value = os.environ.get(CPU_BACKEND_ENV, "").strip()
    if not value:
        return None
    if value not in ("auto", *CPU_BACKENDS):
        raise ValueError(f"{CPU_BACKEND_ENV}={value[:40]!r} is not a cpu backend: give "
                         f"auto, {', '.join(CPU_BACKENDS)} (or unset it)")
    return value


CPU_RECIPES = {
    "int8-dynamic": "torchao PT2E, X86InductorQuantizer (dynamic): int8 per-channel "
                    "weights, activations quantized per call (7 bits on x86, which may "
                    "lack VNNI); embeddings int8 per row",
    "int8-static": "torchao PT2E, X86InductorQuantizer (static): int8 per-channel "
                   "weights, activation scales from --calibration (7 bits on x86); "
                   "embeddings int8 per row",
    "int8-weight": "torchao Int8WeightOnlyConfig: int8 per-channel linear and "
                   "embedding weights, float activations (Inductor's weight-only int8 GEMM "
                   "at bfloat16; other dtypes' plain builds store them dequantized)",
    "int4-weight": "int4 linear weights in groups of 32 (torchao's asymmetric "
                   "quantization), ATen's int4 CPU GEMM with bfloat16 rows inside, "
                   "float in and out (passes/quantize/int4_cpu.py); embeddings int8 per row",
}
CUDA_RECIPES = {
    "int8-weight": "torchao Int8WeightOnlyConfig: int8 per-channel linear and "
                   "embedding weights, float activations (a decode step's int8 rows; "
                   "plain builds below bfloat16 store them dequantized)",
    "int4-weight": "int4 rows (groups of 128, or 64/32 where in_features needs; "
                   "asymmetric, a scale and offset per group): the decode kernels read "
                   "them, a prompt runs the unpacked weight's GEMM (kernels/int4_rows.py); "
                   "embeddings int8 per row (EDGE_EXPORTER_INT4_ROWS=0: torchao "
                   "Int4WeightOnlyConfig's tinygemm layout and kernel)",
}


def compiler_here() -> tuple[bool, str]:
    choice = choose_cxx()
    return choice.compiler is not None, choice.note


def gpu_here() -> tuple[bool, str]:
    """A CPU-only torch build says so in its version ("2.13.0+cpu"): no need to import it."""
    version = importlib.metadata.version("torch")
    if version.endswith("+cpu"):
        return False, f"torch {version} is a CPU-only build (install a CUDA build of torch)"
    import torch
    if torch.version.cuda is None:
        return False, (f"torch {torch.__version__} is a CPU-only build (install a CUDA "
                       "build of torch)")
    if not torch.cuda.is_available():
        return False, (f"no CUDA GPU is visible (torch {torch.__version__}, CUDA "
                       f"{torch.version.cuda})")
    compiler_ok, compiler = compiler_here()
    if not compiler_ok:
        return False, compiler
    name = torch.cuda.get_device_name()
    major, minor = torch.cuda.get_device_capability()
    return True, f"{name} (sm_{major}{minor}), CUDA {torch.version.cuda}; {compiler}"


CPU = TargetCard("cpu", "cpu", "aoti", "this machine's CPU family: AOTInductor C++/OpenMP, "
                 "or ONNX Runtime where it runs a partition faster (--cpu-backend)",
                 CpuOptions, tuple(CPU_RECIPES), check=compiler_here)
CUDA = TargetCard("cuda", "cuda", "aoti", "AOTInductor Triton kernels for NVIDIA GPUs, "
                  "replayed as CUDA graphs", AotiOptions, tuple(CUDA_RECIPES), check=gpu_here)
