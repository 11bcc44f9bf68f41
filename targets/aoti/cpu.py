"""Target ``cpu``: the whole program through AOTInductor's C++/OpenMP backend."""

from __future__ import annotations

from runtime.manifest import Requirements
from targets import cpu_isa
from targets.aoti.base import AOTInductorTarget
from targets.base import LowerOptions


class CpuTarget(AOTInductorTarget):
    name = "cpu"
    device = "cpu"
    description = "AOTInductor C++/OpenMP for this machine's CPU family"
    quant_recipes = {
        "int8-dynamic": "torchao PT2E, X86InductorQuantizer (dynamic): int8 per-channel "
                        "weights, activations quantized per call; embeddings int8 per row",
        "int8-static": "torchao PT2E, X86InductorQuantizer (static): int8 per-channel "
                       "weights, activation scales from --calibration; embeddings int8 "
                       "per row",
        "int8-weight": "torchao Int8WeightOnlyConfig: int8 per-channel linear and "
                       "embedding weights, float activations (Inductor's weight-only int8 GEMM)",
        "int4-weight": "int4 linear weights in groups of 32 (torchao's asymmetric "
                       "quantization), ATen's int4 CPU GEMM with bfloat16 rows inside, "
                       "float in and out (passes/int4_cpu.py); embeddings int8 per row",
    }

    def quantizer(self, recipe: str) -> object:
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86
        config = x86.get_default_x86_inductor_quantization_config(
            is_dynamic=recipe == "int8-dynamic")
        return x86.X86InductorQuantizer().set_global(config)

    def inductor_configs(self, options: LowerOptions) -> dict:
        level = cpu_isa.resolve(options.cpu_isa)
        return {**super().inductor_configs(options), **cpu_isa.inductor_configs(level)}

    def requirements(self, options: LowerOptions) -> Requirements:
        isa, flags = cpu_isa.required_flags(cpu_isa.resolve(options.cpu_isa))
        base = self.base_requirements()
        return Requirements(arch=base.arch, torch=base.torch, cpu_isa=isa, cpu_flags=flags)
