"""The cards of ``cpu`` and ``cuda`` (targets/card.py): their options and recipes, and
whether they work here, without importing torch where the answer needs none."""

from __future__ import annotations

import importlib.metadata

from pydantic import Field

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


CPU_RECIPES = {
    "int8-dynamic": "torchao PT2E, X86InductorQuantizer (dynamic): int8 per-channel "
                    "weights, activations quantized per call; embeddings int8 per row",
    "int8-static": "torchao PT2E, X86InductorQuantizer (static): int8 per-channel "
                   "weights, activation scales from --calibration; embeddings int8 "
                   "per row",
    "int8-weight": "torchao Int8WeightOnlyConfig: int8 per-channel linear and "
                   "embedding weights, float activations (Inductor's weight-only int8 GEMM)",
    "int4-weight": "int4 linear weights in groups of 32 (torchao's asymmetric "
                   "quantization), ATen's int4 CPU GEMM with bfloat16 rows inside, "
                   "float in and out (passes/quantize/int4_cpu.py); embeddings int8 per row",
}
CUDA_RECIPES = {
    "int8-weight": "torchao Int8WeightOnlyConfig: int8 per-channel linear and "
                   "embedding weights, float activations (Triton mixed-dtype GEMM)",
    "int4-weight": "torchao Int4WeightOnlyConfig (groups of 128, or 64/32 where "
                   "in_features needs, tinygemm layout): int4 "
                   "linear weights, bfloat16 GEMM inside, float32 in and out; "
                   "embeddings int8 per row",
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


CPU = TargetCard("cpu", "cpu", "aoti", "AOTInductor C++/OpenMP for this machine's CPU family",
                 AotiOptions, tuple(CPU_RECIPES), check=compiler_here)
CUDA = TargetCard("cuda", "cuda", "aoti", "AOTInductor Triton kernels for NVIDIA GPUs, "
                  "replayed as CUDA graphs", AotiOptions, tuple(CUDA_RECIPES), check=gpu_here)
