"""The Triton kernel behind ``edge_exporter::depthwise_conv2d`` (depthwise_conv.py): a
depthwise convolution computed directly, each program a tile of output pixels by
channels, a loop over the filter rows with each row's taps unrolled, fp32 sums.

The input may be laid out channels-last or channels-first: the tile's fast axis is the
one contiguous in memory (channels, or pixels along a row), so each tap's loads are
coalesced, and neighbouring taps read the same lines again from L1. The sizes are
runtime arguments (Triton specialises strides of 1), the kernel size, stride, padding
and dilation constants.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def depthwise_conv_kernel(x_ptr, w_ptr, b_ptr, out_ptr, C, H, W, HO, WO,
                          sxn, sxc, sxh, sxw, son, soc, soh, sow,
                          KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr,
                          SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
                          DH: tl.constexpr, DW: tl.constexpr, HAS_BIAS: tl.constexpr,
                          PIXELS_FAST: tl.constexpr, BLOCK_P: tl.constexpr,
                          BLOCK_C: tl.constexpr):
    n = tl.program_id(2)
    pixels = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    if PIXELS_FAST:  # [channels, pixels]: a row of pixels contiguous (channels-first)
        p = pixels[None, :]
        c = channels[:, None]
        acc = tl.zeros((BLOCK_C, BLOCK_P), dtype=tl.float32)
    else:  # [pixels, channels]: channels contiguous (channels-last)
        p = pixels[:, None]
        c = channels[None, :]
        acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    oh = p // WO
    ow = p % WO
    p_ok = p < HO * WO
    c_ok = c < C
    x_base = x_ptr + n * sxn + c * sxc
    for i in range(KH):  # a loop over the filter's rows, its columns unrolled: with all
        # KH * KW taps unrolled, timing five tiles of one shape outran a 60 s call
        ih = oh * SH - PH + i * DH
        row_ok = p_ok & (ih >= 0) & (ih < H)
        for j in tl.static_range(KW):
            iw = ow * SW - PW + j * DW
            ok = row_ok & (iw >= 0) & (iw < W) & c_ok
            x = tl.load(x_base + ih * sxh + iw * sxw, mask=ok, other=0.0)
            tap = tl.load(w_ptr + c * (KH * KW) + (i * KW + j), mask=c_ok, other=0.0)
            acc += x.to(tl.float32) * tap.to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(b_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
    out = out_ptr + n * son + c * soc + oh * soh + ow * sow
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=p_ok & c_ok)


def output_like(x: torch.Tensor, out_shape: tuple) -> torch.Tensor:
    """The output, laid out as the input is (channels-last or not)."""
    last = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not (
        x.is_contiguous())
    fmt = torch.channels_last if last else torch.contiguous_format
    return torch.empty(out_shape, dtype=x.dtype, device=x.device, memory_format=fmt)


def launch_depthwise_conv(x, weight, bias, stride, padding, dilation, block_p: int,
                          block_c: int, warps: int, wrap: bool = True) -> torch.Tensor:
    """The op's kernel; ``wrap``: through torch's wrap_triton (what torch.export and
    AOTInductor trace into), else Triton's own launcher (tests)."""
    from torch.library import wrap_triton
    n, c, h, w = x.shape
    kh, kw = weight.shape[2:]
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = output_like(x, (n, c, ho, wo))
    kernel = wrap_triton(depthwise_conv_kernel) if wrap else depthwise_conv_kernel
    grid = (triton.cdiv(ho * wo, block_p), triton.cdiv(c, block_c), n)
    kernel[grid](x, weight.contiguous(), weight if bias is None else bias, out,
                 c, h, w, ho, wo, *x.stride(), *out.stride(),
                 KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw,
                 HAS_BIAS=bias is not None, PIXELS_FAST=x.stride(3) == 1 and c > 1,
                 BLOCK_P=block_p, BLOCK_C=block_c, num_warps=warps)
    return out
