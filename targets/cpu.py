"""Target ``cpu``: the whole program through AOTInductor's C++/OpenMP backend."""

from __future__ import annotations

from runtime.manifest import Requirements
from targets import cpu_isa
from targets.aoti import AOTInductorTarget
from targets.base import LowerOptions


class CpuTarget(AOTInductorTarget):
    name = "cpu"
    device = "cpu"
    description = "AOTInductor C++/OpenMP for this machine's CPU family"

    def inductor_configs(self, options: LowerOptions) -> dict:
        level = cpu_isa.resolve(options.cpu_isa)
        return {**super().inductor_configs(options), **cpu_isa.inductor_configs(level)}

    def requirements(self, options: LowerOptions) -> Requirements:
        isa, flags = cpu_isa.required_flags(cpu_isa.resolve(options.cpu_isa))
        base = self.base_requirements()
        return Requirements(arch=base.arch, torch=base.torch, cpu_isa=isa, cpu_flags=flags)
