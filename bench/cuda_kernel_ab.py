"""Single kernels of batch-1 fp16 models, one way against another, on the GPU: what the
cuda target's rewrites bet on, timed without a whole build.

    python bench/cuda_kernel_ab.py --json-out OUT.jsonl

- depthwise convolutions: cuDNN's (``F.conv2d(groups=C)``, channels-last input) against
  Inductor's kernel for the taps rewrite (targets/aoti/passes/depthwise_convs.py);
- ``direct``: the larger depthwise convolutions as the cuda target times them at build
  time (passes/depthwise_kernel.py: cuDNN at its faster layout against our direct kernel
  at each tile), with the tile it would choose and the kernel's max difference;
- a linear then GELU: cuBLAS then a pointwise kernel, against ``_addmm_activation`` (one
  cuBLASLt GEMM with a GELU epilogue; tanh-approximate GELU);
- attention at ViT's and GPT-2's sizes, and Swin-T's windows with their additive mask (its
  four stages: windows x heads x 49 tokens, head width 32): each SDPA backend (efficient
  attention also with the mask stored at an aligned row stride), the written-out form
  (q @ k^T + mask, softmax, @ v) that written_attention_as_sdpa replaces, and that form
  with keys, values and mask padded to aligned rows.
Each time is ``triton.testing.do_bench_cudagraph`` (a graph of the call, replayed;
median ms), with the max difference against the first way.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from targets.aoti.passes.depthwise_convs import depthwise_conv  # noqa: E402

HALF = torch.float16
DEPTHWISE = [  # (channels, size, kernel, stride): ConvNeXt-T's stages, MobileNet/EfficientNet's
    (96, 56, 7, 1), (192, 28, 7, 1), (384, 14, 7, 1), (768, 7, 7, 1),
    (96, 112, 3, 2), (144, 56, 3, 1), (240, 28, 5, 1), (672, 14, 5, 2), (960, 7, 3, 1)]
GELU_LINEARS = [(197, 768, 3072), (196, 768, 3072), (768, 196, 384), (197, 384, 1536),
                (128, 768, 3072)]
ATTENTION = [((1, 12, 197, 64), False), ((1, 6, 197, 64), False), ((1, 12, 128, 64), True)]
MASKED_ATTENTION = [(64, 3, 49, 32), (16, 6, 49, 32), (4, 12, 49, 32), (1, 24, 49, 32)]


def timed(fn) -> float:
    from triton.testing import do_bench_cudagraph
    fn()
    torch.cuda.synchronize()
    return round(do_bench_cudagraph(fn, rep=100), 4)


def depthwise_rows() -> list[dict]:
    rows = []
    torch._dynamo.config.cache_size_limit = 64  # one compile per shape, each static
    for channels, size, kernel, stride in DEPTHWISE:
        x = torch.randn(1, channels, size, size, device="cuda", dtype=HALF).to(
            memory_format=torch.channels_last)
        w = torch.randn(channels, 1, kernel, kernel, device="cuda", dtype=HALF) * 0.1
        b = torch.randn(channels, device="cuda", dtype=HALF)
        pad = kernel // 2
        args = ([stride] * 2, [pad] * 2, [1, 1])
        taps = torch.compile(lambda x: depthwise_conv(x, w, b, *args), dynamic=False)
        want = F.conv2d(x, w, b, stride, pad, 1, channels)
        got = taps(x)
        rows.append({"what": "depthwise", "shape": [channels, size, kernel, stride],
                     "cudnn_ms": timed(lambda: F.conv2d(x, w, b, stride, pad, 1, channels)),
                     "taps_ms": timed(lambda: taps(x)),
                     "max_diff": float((got.float() - want.float()).abs().max())})
    return rows


# (channels, size, kernel, stride, channels-last): ConvNeXtV2-Atto's and ConvNeXt-T's
# first 7x7s, MixNet-style 9x9s over few channels
DIRECT = [(40, 56, 7, 1, True), (96, 56, 7, 1, True), (192, 28, 7, 1, True),
          (96, 56, 7, 1, False), (24, 56, 9, 1, True), (80, 28, 9, 1, True)]


def direct_rows() -> list[dict]:
    from targets.aoti.kernels.depthwise_conv import depthwise_conv2d
    from targets.aoti.passes.depthwise_kernel import DepthwiseConvsByTiming
    timing, rows = DepthwiseConvsByTiming(), []
    for channels, size, kernel, stride, last in DIRECT:
        x = torch.randn(1, channels, size, size, device="cuda", dtype=HALF)
        x = x.to(memory_format=torch.channels_last) if last else x
        w = torch.randn(channels, 1, kernel, kernel, device="cuda", dtype=HALF) * 0.1
        b = torch.randn(channels, device="cuda", dtype=HALF)
        args = ([stride] * 2, [kernel // 2] * 2, [1, 1])
        times = timing.times(x, w, b, *args)
        tile = timing.pick(times, None)
        got = depthwise_conv2d(x, w, b, *args, *(tile or min(
            (t for t in times if t != "cudnn"), key=times.get)))
        want = F.conv2d(x.float(), w.float(), b.float(), *args, groups=channels)
        rows.append({"what": "direct", "shape": [channels, size, kernel, stride],
                     "channels_last": last, "chosen": str(tile),
                     "us": {str(k): round(v * 1000, 2) for k, v in times.items()},
                     "max_diff": float((got.float() - want).abs().max())})
    return rows


def gelu_rows() -> list[dict]:
    rows = []
    for m, k, n in GELU_LINEARS:
        x = torch.randn(m, k, device="cuda", dtype=HALF)
        w = torch.randn(n, k, device="cuda", dtype=HALF) / k ** 0.5
        b = torch.randn(n, device="cuda", dtype=HALF)
        want = F.gelu(F.linear(x, w, b), approximate="tanh")
        got = torch._addmm_activation(b, x, w.t(), use_gelu=True)
        rows.append({"what": "linear_gelu", "shape": [m, k, n],
                     "separate_ms": timed(lambda: F.gelu(F.linear(x, w, b))),
                     "epilogue_ms": timed(
                         lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)),
                     "max_diff": float((got.float() - want.float()).abs().max())})
    return rows


def attention_rows() -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    for shape, causal in ATTENTION:
        q, k, v = (torch.randn(shape, device="cuda", dtype=HALF) for _ in range(3))
        row = {"what": "attention", "shape": list(shape), "causal": causal}
        for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                        SDPBackend.EFFICIENT_ATTENTION):
            with sdpa_kernel([backend]):
                try:
                    row[backend.name] = timed(lambda: F.scaled_dot_product_attention(
                        q, k, v, is_causal=causal))
                except RuntimeError as exc:
                    row[backend.name] = f"refused: {str(exc)[:80]}"
        rows.append(row)
    for shape in MASKED_ATTENTION:
        q, k, v = (torch.randn(shape, device="cuda", dtype=HALF) for _ in range(3))
        mask = torch.randn(*shape[:2], shape[2], shape[2], device="cuda", dtype=HALF)
        want = torch.softmax((q @ k.transpose(-2, -1)) * shape[3] ** -0.5 + mask, -1) @ v
        row = {"what": "masked_attention", "shape": list(shape),
               "written_ms": timed(lambda: torch.softmax(
                   (q @ k.transpose(-2, -1)) * shape[3] ** -0.5 + mask, -1) @ v)}
        # the written form with keys, values and mask padded to aligned rows beforehand
        # (zero keys masked out by -inf): every GEMM operand 16-byte aligned
        pad = -shape[2] % 8
        kp, vp = F.pad(k, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad))
        maskp = F.pad(mask, (0, pad), value=float("-inf"))
        padded = lambda: torch.softmax(  # noqa: E731
            (q @ kp.transpose(-2, -1)) * shape[3] ** -0.5 + maskp, -1) @ vp
        row["written_padded_ms"] = timed(padded)
        row["written_padded_max_diff"] = float((padded() - want).abs().max())
        # the mask stored with an aligned row stride: no per-call pad for efficient attention
        aligned = torch.empty(*mask.shape[:-1], shape[2] + pad, device="cuda", dtype=HALF)
        aligned = aligned[..., :shape[2]].copy_(mask)
        for backend, label, bias in ((SDPBackend.CUDNN_ATTENTION, None, mask),
                                     (SDPBackend.EFFICIENT_ATTENTION, None, mask),
                                     (SDPBackend.EFFICIENT_ATTENTION, "aligned_mask", aligned)):
            name = backend.name + (f"_{label}" if label else "")
            with sdpa_kernel([backend]):
                try:
                    got = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
                    row[name] = timed(lambda: F.scaled_dot_product_attention(
                        q, k, v, attn_mask=bias))
                    row[f"{name}_max_diff"] = float((got - want).abs().max())
                except RuntimeError as exc:
                    row[name] = f"refused: {str(exc)[:80]}"
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json-out", default="build/cuda-kernel-ab.jsonl")
    parser.add_argument("--rows", default="attention,depthwise,gelu",
                        help="which tables (depthwise compiles one kernel a shape: minutes)")
    args = parser.parse_args()
    tables = {"attention": attention_rows, "depthwise": depthwise_rows, "gelu": gelu_rows,
              "direct": direct_rows}
    inductor = torch._inductor.config
    header = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
              "enable_pdl": hasattr(inductor.triton, "enable_pdl"),
              "sdp_priority": [str(b) for b in torch._C._get_sdp_priority_order()]
              if hasattr(torch._C, "_get_sdp_priority_order") else None}
    print(json.dumps(header), flush=True)
    with open(args.json_out, "a") as sink, torch.inference_mode():
        for name in args.rows.split(","):
            for row in tables[name]():
                sink.write(json.dumps({**header, **row}) + "\n")
                sink.flush()
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
