"""Target ``cpu``: each partition through AOTInductor's C++/OpenMP backend, or through
ONNX Runtime where that runs it faster here (``--cpu-backend``: targets/aoti/choice.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import platform
from typing import Iterator

from torch.export import ExportedProgram

from passes.base import Pass
from passes.cleanup.stable_sort import StableSort
from runtime.format.manifest import Requirements
from targets import cpu_isa
from targets.aoti import choice
from targets.aoti.base import AotiPackaging, AOTInductorTarget
from targets.aoti.card import CPU, CPU_RECIPES, CpuOptions
from targets.aoti.linear_packing import float32_linears_unpacked
from targets.base import Lowered, LowerOptions, base_requirements
from targets.facets import Quantization


class X86Quantization(Quantization):
    def quantizer(self, recipe: str) -> object:
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86
        config = x86.get_default_x86_inductor_quantization_config(
            is_dynamic=recipe == "int8-dynamic", reduce_range=seven_bit_activations())
        return x86.X86InductorQuantizer().set_global(config)

    def record(self, recipe: str) -> dict:
        return {"activation_bits": 7 if seven_bit_activations() else 8}


def seven_bit_activations() -> bool:
    """Whether activations keep to 7 bits (torchao's ``reduce_range``): the zoo encoder's
    int8-dynamic build reached 15.6 dB on an AVX2-only CPU with 8 bits."""
    return cpu_isa.int8_pairs_may_saturate(platform.machine())


class CpuPackaging(AotiPackaging):
    def nondeterminism(self, options: LowerOptions) -> list[str]:
        found = super().nondeterminism(options)
        if (choice.asked_for(options)[0] == "auto" and not options.deterministic
                and not choice.not_offered(options)):
            found.append("--cpu-backend auto: each partition keeps the backend that ran it "
                         "fastest here, and the manifest records the figures")
        return found


class CpuTarget(AOTInductorTarget):
    name, device, description = CPU.name, CPU.device, CPU.description
    Options = CpuOptions
    quantization = X86Quantization(recipes=CPU_RECIPES)
    packaging = CpuPackaging()

    def default_passes(self, options: LowerOptions) -> list[Pass]:
        # each candidate is checked exactly against the partition's own outputs: a
        # sort's equal keys must come out in the one order every backend gives
        return [*super().default_passes(options), StableSort()]

    def lower(self, program: ExportedProgram, options: LowerOptions) -> Lowered:
        return choice.lower_chosen(program, options, {"aoti": self._lower_mkl_linears,
                                                      choice.PACKED: super().lower,
                                                      "onnx": choice.lower_as_onnx})

    def _lower_mkl_linears(self, program: ExportedProgram, options: LowerOptions) -> Lowered:
        """AOTInductor with float32 linears on ATen's GEMM (linear_packing.py); records
        their multiply-adds a call, which say whether Inductor's own packing is worth a
        compile of its own (choice.PACKED)."""
        with float32_linears_unpacked() as unpacked:
            lowered = super().lower(program, options)
        return dataclasses.replace(lowered, choice={"float32_linear_macs": unpacked.macs})

    def lowering_fixes(self, options: LowerOptions) -> contextlib.AbstractContextManager:
        return _int4_rows_contiguous()

    def inductor_configs(self, options: LowerOptions, dynamic: bool = False,
                         data_sizes: bool = False) -> dict:
        level = cpu_isa.resolve(options.cpu_isa)
        return {**super().inductor_configs(options, dynamic, data_sizes),
                **cpu_isa.inductor_configs(level)}

    def requirements(self, options: LowerOptions) -> Requirements:
        isa, flags = cpu_isa.required_flags(cpu_isa.resolve(options.cpu_isa))
        base = base_requirements()
        return Requirements(arch=base.arch, torch=base.torch, cpu_isa=isa, cpu_flags=flags)


@contextlib.contextmanager
def _int4_rows_contiguous() -> Iterator[None]:
    """ATen's int4 CPU GEMM takes contiguous rows only ("_weight_int4pack_mm_cpu : expect A
    to be contiguous"), and Inductor's lowering of it (torch 2.13) hands it whatever layout
    its producer had: Whisper's encoder, whose rows come transposed from its convolutions,
    built and then failed at its first call. The rows are made contiguous first (a copy
    only where they are not); ``.contiguous()`` in the graph cannot say it, as the traced
    tensor already is."""
    import torch
    from torch._inductor import ir
    from torch._inductor.lowering import lowerings
    op = torch.ops.aten._weight_int4pack_mm_for_cpu.default
    original = lowerings.get(op)
    if original is None:
        yield
        return

    def contiguous_rows(rows, *args, **kwargs):
        return original(ir.ExternKernel.require_contiguous(rows), *args, **kwargs)

    lowerings[op] = contiguous_rows
    try:
        yield
    finally:
        lowerings[op] = original
