"""Target ``cuda``: the whole program through AOTInductor's Triton backend (kernels as cubin).

The manifest records what the artifact needs: the GPU compute capability it was
built on (cubins are compiled for it), and the CUDA and torch versions.
"""

from __future__ import annotations

import contextlib
import os

import torch

from runtime.format.manifest import Requirements
from targets.aoti.base import AotiGeneration, AotiPackaging, AOTInductorTarget, AotiTooling
from targets.aoti.card import CUDA, CUDA_RECIPES, gpu_here
from targets.aoti.dependent_kernels import dependent_kernels, inductor_settings
from targets.aoti.kernel_timing import flat_pointwise_untuned, host_independent_kernel_timing
from targets.aoti.kernels import int4_rows
from targets.aoti.kernels import ops as decode_ops
from targets.aoti.kernels.dependent_launch import dependent_launches
from targets.aoti.passes.aligned_linears import (
    LinearInputsAlignedByPadding,
    LinearsAlignedByPadding,
)
from targets.aoti.passes.attention_kernels import AttentionKernelsByTiming
from targets.aoti.passes.attention_views import AttentionInputsAsViews
from targets.aoti.passes.conv_gemms import ConvsAsGemmsByTiming
from targets.aoti.passes.decode_kernels import DecodeAttentionAsKernel, RowLinearsAsKernels
from targets.aoti.passes.depthwise_convs import DepthwiseConvsAsTaps
from targets.aoti.passes.depthwise_kernel import DepthwiseConvsByTiming
from targets.aoti.passes.gelu_epilogues import TanhGeluAsGemmEpilogue
from targets.aoti.passes.group_norms import OneGroupNormsInPixelOrder
from targets.aoti.passes.grouped_convs import GroupedConvsAsBatchedGemms
from targets.aoti.passes.narrow_convs import NarrowConvsPaddedByTiming
from targets.aoti.passes.patch_convs import PatchConvsAsMatmuls
from targets.aoti.passes.pixel_convs import PixelConvsAsRowLinears
from targets.aoti.passes.row_linear_choice import RowLinearsOnCublasByTiming
from targets.aoti.passes.row_linears import SingleRowLinearsAsReductions
from targets.aoti.passes.written_attention import WrittenAttentionAsSdpa
from targets.aoti.wrapper_arrays import arrays_declared
from targets.base import (
    ABSENT,
    OK,
    PROBLEM,
    Availability,
    Check,
    LowerOptions,
    base_requirements,
)
from targets.facets import Quantization


# Passes not yet shown faster inside a whole build: off by default;
# bench/cuda_gap.py turns them on by name to time them inside whole builds.
CANDIDATE_PASSES = {p.name: p for p in (LinearInputsAlignedByPadding, ConvsAsGemmsByTiming,
                                        PixelConvsAsRowLinears, NarrowConvsPaddedByTiming,
                                        DepthwiseConvsByTiming)}


class CudaPackaging(AotiPackaging):
    def nondeterminism(self, options: LowerOptions) -> list[str]:
        found = super().nondeterminism(options)
        if not options.deterministic:
            found.append("Inductor times Triton kernel configurations on this GPU and keeps the "
                         "fastest, and each attention call's and lone one-row linear's "
                         "kernel is chosen by timing "
                         "(--deterministic turns this off)")
        return found


class CudaTooling(AotiTooling):
    def doctor_checks(self) -> list[Check]:
        return [*super().doctor_checks(), _gpu_check()]


class CudaQuantization(Quantization):
    """int4-weight as int4 rows our decode kernels read (kernels/int4_rows.py), with the
    folds a decode step gains from (bench/RESULTS.md, session 68: the 4-layer step);
    ``EDGE_EXPORTER_INT4_ROWS=0`` keeps torchao's tinygemm."""

    def linear_format(self, recipe: str):
        if os.environ.get(int4_rows.ROWS_ENV) == "0":
            return None, ""
        return super().linear_format(recipe)


class CudaTarget(AOTInductorTarget):
    name, device, description = CUDA.name, CUDA.device, CUDA.description
    # SDPA's GPU kernels (exporter/lm/attention.py: measured). In a decode step, the
    # greedy token taken in the head's kernel (passes/decode_argmax.py), each attention
    # and o as one launch (passes/attention_o.py) and that launch storing the step's new
    # K/V rows (passes/attention_store.py), the head's token kernel advancing the step's
    # inputs (passes/decode_argmax.py), the first two over int4 rows too, int8 products
    # with the norm folded against x's int8 codes: on, each measured faster on a whole
    # ~1.1B build
    generation = AotiGeneration(step_attention="sdpa", next_token=True, attention_o=True,
                                store_rows=True, advance_inputs=True, int4_fused=True,
                                int8_x_codes=True)
    packaging = CudaPackaging()
    tooling = CudaTooling()
    quantization = CudaQuantization(recipes=CUDA_RECIPES, linear_formats={
        "int4-weight": (int4_rows.swap, int4_rows.LAYOUT)})

    def availability(self) -> Availability:
        return Availability(*gpu_here())

    def default_passes(self, options: LowerOptions) -> list:
        passes = super().default_passes(options)
        if not options.fuse:
            return passes
        # GEMMs cuBLAS runs well in place of a patch convolution and of an unaligned head;
        # small depthwise convolutions as Inductor's reductions, group convolutions cuDNN
        # wraps in layout transforms as batched GEMMs, a tanh GELU as its GEMM's epilogue,
        # a one-group GroupNorm's statistics in channels-last order (two kernels, not three)
        # (each kept for being faster inside whole builds, not in isolation);
        # written-out attention as one SDPA call, attention inputs as views, not copies,
        # each attention call's kernel timed on this GPU (those two not with --deterministic);
        # last, after --quantize: its linears keep their own kernels (passes/row_linears.py);
        # a decode step's products and attention as our Triton kernels, the rest of the
        # one-row linears as Inductor's reductions (passes/decode_kernels.py), but a
        # plain build's lone one-row linears on cuBLAS where it times faster
        decode = [DecodeAttentionAsKernel(store_rows=self.generation.store_rows),
                  RowLinearsAsKernels(attention_o=self.generation.attention_o,
                                      advance_inputs=self.generation.advance_inputs,
                                      int4=self.generation.int4_fused,
                                      int8_x_codes=self.generation.int8_x_codes)
                  ] if decode_ops.TRITON else []
        # not in generating builds (measured on plain ones): a decode step's one-row fc1
        # keeps its row kernel, its attention its decode kernel
        plain = not options.shared_weights
        epilogue = [TanhGeluAsGemmEpilogue()] if plain else []
        # the fold paid only with the timed kernel (torch's choice, cuDNN's, was slower)
        timing = plain and not options.deterministic
        written = [WrittenAttentionAsSdpa()] if timing else []
        kernels = [AttentionKernelsByTiming()] if timing else []
        cublas = [RowLinearsOnCublasByTiming()] if timing and decode else []
        return [*passes, PatchConvsAsMatmuls(), LinearsAlignedByPadding(),
                DepthwiseConvsAsTaps(), GroupedConvsAsBatchedGemms(),
                *epilogue, *written, OneGroupNormsInPixelOrder(), AttentionInputsAsViews(),
                *cublas, *decode, *kernels,
                SingleRowLinearsAsReductions()]

    def lowering_fixes(self, options: LowerOptions) -> contextlib.AbstractContextManager:
        # Coordinate-descent tuning (below) then times each candidate with the host out
        # of the measurement, so a busy host does not choose the kernels (kernel_timing.py),
        # and not for 1-D pointwise kernels, where it did not pay.
        # The decode kernels start as programmatic dependent launches on Hopper and later
        # (kernels/dependent_launch.py), and so do Inductor's own kernels under the
        # setting inductor_configs gives (dependent_kernels.py; entered after that rewrite,
        # which it extends).
        fixes = contextlib.ExitStack()
        fixes.enter_context(arrays_declared())  # its C++ wrapper compiles (wrapper_arrays.py)
        fixes.enter_context(dependent_launches())
        fixes.enter_context(dependent_kernels())
        if not options.deterministic:
            fixes.enter_context(flat_pointwise_untuned())
            fixes.enter_context(host_independent_kernel_timing())
        return fixes

    def inductor_configs(self, options: LowerOptions, dynamic: bool = False,
                         data_sizes: bool = False) -> dict:
        # The CPU vector ISA only labels the package here (no CPU kernels are
        # vectorised for a GPU program); skip Inductor's compile-and-run probes of it.
        configs = {**super().inductor_configs(options, dynamic, data_sizes),
                   "cpp.vec_isa_ok": True}
        if not options.shared_weights:
            # Inductor's kernels as dependent launches (dependent_kernels.py), recorded in
            # the manifest with the other settings; generating builds keep plain launches
            # until the decode step is measured with it.
            configs.update(inductor_settings())
        if options.shared_weights and data_sizes:
            # Inductor runs Triton kernels while it compiles (timing their configurations),
            # on inputs sized by each symbol's hint; a value read from a tensor has none,
            # and stands in as 8192. In a generating build such a value is a position read
            # from the cache length (MVP numbers its positions arange(t, t + T) from it), so
            # the lookup at 8192 + T fell outside the position table, a device-side assert
            # that killed the build. 0 is what a position is at a prompt's first chunk.
            configs["unbacked_symint_fallback"] = 0
        if not options.deterministic:
            # Time each Triton reduction's block sizes on this GPU: the batch-1 decode
            # step's matrix-vector products (passes/row_linears.py) gain the most.
            configs["coordinate_descent_tuning"] = True
        if options.shared_weights and not options.deterministic and not dynamic:
            # A generating build's decode step: independent small kernels (a layer's
            # rotary, cache rows, mask) as one launch, where hundreds of kernels each cost
            # a launch gap. Only where it was measured and checked:
            # plain builds keep Inductor's default until the cuda coverage suite has run
            # with it. (It times its groupings on the GPU, hence not with --deterministic.)
            # Not in programs of dynamic shapes (prefill, a text encoder): Inductor's combo
            # kernels refuse a persistent reduction over a dynamic dim ("Dynamic shape on
            # reduction dimension is not supported": T5's softmax over cache + chunk).
            configs["combo_kernels"] = True
        return configs

    def requirements(self, options: LowerOptions) -> Requirements:
        base = base_requirements()
        major, minor = torch.cuda.get_device_capability()
        return Requirements(arch=base.arch, torch=base.torch, cuda=torch.version.cuda,
                            cuda_capability=f"{major}.{minor}")


def _gpu_check() -> Check:
    if not torch.version.cuda:
        return Check("gpu", ABSENT, "this torch has no CUDA: target cuda is off",
                     "install a CUDA build of torch on a machine with an NVIDIA GPU")
    if not torch.cuda.is_available():
        return Check("gpu", PROBLEM, "torch has CUDA but sees no GPU",
                     "check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES")
    major, minor = torch.cuda.get_device_capability()
    return Check("gpu", OK, f"{torch.cuda.get_device_name()} (compute capability "
                            f"{major}.{minor}); artifacts built here need >= {major}.{minor}")
