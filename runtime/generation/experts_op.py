"""Mixture-of-experts matmuls over quantized expert weights: the CPU fallback's kernels
for a quantized MoE build (passes/quantize/quantize_experts.py writes the calls).

transformers runs a MoE layer's experts as ``grouped_mm_fallback(rows, weight, offs)``:
``rows`` [S, in] sorted by expert, ``weight`` [E, in, out], and rows ``offs[e-1]:offs[e]``
meet ``weight[e]``. No target translates it (ONNX has no grouped matmul; Inductor calls
it as an extern op), so it runs on the CPU fallback, and --quantize used to leave its
weights, ~90% of a real MoE's parameters, in float. These ops take the experts stored
in int8 or int4 and dequantize only the experts a call routes rows to (a decode step
touches top-k of E), so the memory and the file hold the quantized bytes:

- ``grouped_mm_int8(rows, q int8 [E, in, out], scale [E, 1, out], offs)``: symmetric,
  one scale per expert and output column (torchao's int8 weight-only, per channel);
- ``grouped_mm_int4(rows, packed uint8 [E, in/G, G/2, out], scale [E, in/G, 1, out],
  offs)``: symmetric groups of G along ``in`` (the int4-weight groups, 128/64/32), two
  values a byte (low nibble: even index), stored offset by 8.
"""

from __future__ import annotations

import torch

OP_NAMESPACE = "edge_exporter"


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return q.to(dtype) * scale.to(dtype)


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype
                    ) -> torch.Tensor:
    """[..., in/G, G/2, out] packed -> [..., in, out]."""
    low = (packed & 0x0F).to(torch.int8) - 8
    high = (packed >> 4).to(torch.int8) - 8
    groups = torch.stack([low, high], dim=-2)  # [..., in/G, G/2, 2, out]
    shape = groups.shape
    values = groups.reshape(*shape[:-4], shape[-4], shape[-3] * 2, shape[-1])
    full = values.to(dtype) * scale.to(dtype)  # [..., in/G, G, out]
    return full.reshape(*shape[:-4], shape[-4] * shape[-3] * 2, shape[-1])


def grouped_rows(rows: torch.Tensor, offs: torch.Tensor, out_features: int, weight_of
             ) -> torch.Tensor:
    output = torch.zeros(rows.size(0), out_features, device=rows.device, dtype=rows.dtype)
    start = 0
    for expert, end in enumerate(offs.tolist()):  # one host sync for all experts
        if end > start:  # only the experts that got rows are dequantized
            torch.mm(rows[start:end], weight_of(expert), out=output[start:end])
        start = end
    return output


@torch.library.custom_op(f"{OP_NAMESPACE}::grouped_mm_int8", mutates_args=())
def grouped_mm_int8(rows: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                    offs: torch.Tensor) -> torch.Tensor:
    return grouped_rows(rows, offs, q.shape[-1],
                    lambda e: dequantize_int8(q[e], scale[e], rows.dtype))


@grouped_mm_int8.register_fake
def _(rows, q, scale, offs):
    return rows.new_empty(rows.size(0), q.shape[-1])


@torch.library.custom_op(f"{OP_NAMESPACE}::grouped_mm_int4", mutates_args=())
def grouped_mm_int4(rows: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor,
                    offs: torch.Tensor) -> torch.Tensor:
    return grouped_rows(rows, offs, packed.shape[-1],
                    lambda e: dequantize_int4(packed[e], scale[e], rows.dtype))


@grouped_mm_int4.register_fake
def _(rows, packed, scale, offs):
    return rows.new_empty(rows.size(0), packed.shape[-1])
