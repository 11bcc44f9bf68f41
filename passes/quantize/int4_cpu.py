"""``int4-weight`` on CPU: ATen's int4 CPU GEMM (``aten._weight_int4pack_mm_for_cpu``).

    before: linear(x, w: f32 [out, in])
    after:  _weight_int4pack_mm_for_cpu(x.bf16, w: uint8 [out, in/2], group, scales and
            zeros: bf16 [in/group, out, 2]).to(x.dtype) + bias

Why our own weight format and not a torchao config: torchao 0.18 dropped its CPU int4
layout (``Int4WeightOnlyConfig`` packs only CUDA tile formats now), and its 8da4w for CPU
either needs ATen's KleidiAI kernels (aarch64 only; ``torch.backends.kleidiai``) or
decomposes into dequantize + a float GEMM, which AOTInductor ran slower than fp32 on x86;
ATen's kernel, in torch itself, is the fast one there. The quantization is torchao's
(asymmetric groups, float zero points: ``groupwise_affine_quantize_tensor``); only the
packing is ATen's.

The layer is a plain function the graph calls, so re-capture traces it into ATen ops and
the program's weights stay ordinary tensors (safetensors, AOTInductor's constants).
"""

from __future__ import annotations

import torch

# One scale and zero per 32 weights along in_features: the block of llama.cpp's Q4_0 and of
# ONNX Runtime's MatMulNBits on the onnx target, so int4 builds of one model compare alike.
GROUP = 32
OUT_TILE = 16  # _convert_weight_to_int4pack_for_cpu: "expect N to be dividable by 16"


def pack(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | str:
    """(packed uint8 [out, in/2], scales and zeros bf16 [in/GROUP, out, 2]) of a float
    weight [out, in], or why it cannot be packed."""
    from torchao.quantization.utils import groupwise_affine_quantize_tensor
    out_features, in_features = weight.shape
    if in_features % GROUP:
        return f"in_features {in_features} is not a multiple of the int4 group ({GROUP})"
    if out_features % OUT_TILE:
        return (f"out_features {out_features} is not a multiple of {OUT_TILE} "
                "(ATen's int4 CPU layout packs rows in tiles of 16)")
    values, scales_and_zeros = groupwise_affine_quantize_tensor(
        weight.detach().float(), 4, GROUP, dtype=torch.bfloat16)
    # inner_k_tiles is unused by the CPU layout (one layout for every shape)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(values.to(torch.int32), 1)
    return packed, scales_and_zeros


def linear(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor,
           out_features: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` over a packed int4 weight; the kernel takes bfloat16 rows (its float32
    path is far slower), the result comes back in ``x``'s dtype."""
    rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)  # contiguous: targets/aoti/cpu.py
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, packed, GROUP, scales_and_zeros)
    y = y.reshape(*x.shape[:-1], out_features).to(x.dtype)
    return y if bias is None else y + bias
