"""On the GPU machine: the cuda target's decode-step Triton kernels (targets/aoti/
kernels/) checked against their reference math and timed alone, against cuBLAS.

    python bench/decode_kernels_cuda.py [--layers 22] [--sweep] [--int8]

For the ~1.1B LLaMA shape's products (each with what the pass folds into it: the norm,
the gated activation, the residual) and its decode attention over a 512-slot cache.
Every figure is a CUDA graph of one call per layer, each layer with its own weights (L2
holds none of them between calls), replayed after warm-up: CUDA events, median of 30.
GB/s counts the weight bytes of one call over its time. ``--sweep`` times every block
configuration and prints the fastest per shape. ``--int8``: the products over int8 rows
with one fp16 scale a row (``--quantize int8-weight``), their bytes counted as stored.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.decode_kernels_microbench import graph_time  # noqa: E402

# (name, N out, K in, norm, act, residual)
SHAPES = (("qkv+norm", 2560, 2048, True, 0, False), ("o+res", 2048, 2048, False, 0, True),
          ("gate_up+norm+silu", 5632, 2048, True, 1, False),
          ("down+res", 2048, 5632, False, 0, True), ("lm_head+norm", 32000, 2048, True, 0, False))


def graph_ms(calls) -> float:
    return graph_time(calls, warm=2, runs=30)


def gemv_case(name, n, k, norm, act, res, layers, configs, int8=False):
    from targets.aoti.kernels import reference
    from targets.aoti.kernels.triton_kernels import gemv_config, launch_row_gemv
    dt = torch.float16
    rows = 2 * n if act else n
    if int8:
        weights = [torch.randint(-127, 128, (rows, k), device="cuda", dtype=torch.int8)
                   for _ in range(layers)]
        scale = torch.rand(rows, device="cuda", dtype=dt) * 2e-4 + 1e-4
    else:
        weights = [torch.randn(rows, k, device="cuda", dtype=dt) * 0.02 for _ in range(layers)]
        scale = None
    x = torch.randn(1, 1, k, device="cuda", dtype=dt)
    nw = torch.rand(k, device="cuda", dtype=dt) + 0.5 if norm else None
    r = torch.randn(1, 1, n, device="cuda", dtype=dt) if res else None
    ref = reference.row_gemv(x, weights[0], None, nw, r, 1e-5, 0.0, act, scale).float()
    got = launch_row_gemv(x, weights[0], None, nw, r, 1e-5, 0.0, act,
                          weight_scale=scale).float()
    err = ((got - ref).norm() / ref.norm()).item()
    wbytes = rows * k * weights[0].element_size() + (rows * 2 if int8 else 0)
    out = {}
    for config in configs:
        try:
            ms = graph_ms([lambda w=w, c=config: launch_row_gemv(x, w, None, nw, r, 1e-5, 0.0,
                                                                  act, c, weight_scale=scale)
                           for w in weights])
        except Exception as exc:  # noqa: BLE001 - a config that does not compile
            print(f"  {name} {config}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        out[config] = ms * 1000 / layers
    # cuBLAS over the same rows in fp16 (for int8 rows: what int8 saves against)
    dense = [w.to(dt) for w in weights] if int8 else weights
    linear_us = graph_ms([lambda w=w: torch.nn.functional.linear(x, w) for w in dense]) \
        * 1000 / layers
    default = gemv_config(n, k, bool(act), False, weights[0].element_size())
    best = min(out, key=out.get)
    us = out.get(default, float("nan"))
    label = name + (" int8" if int8 else "")
    print(f"{label:20s} rel.err {err:.1e}  default {default} {us:6.2f} us "
          f"{wbytes / us / 1e3:6.0f} GB/s | best {best} {out[best]:6.2f} us "
          f"{wbytes / out[best] / 1e3:6.0f} GB/s | cuBLAS linear alone {linear_us:6.2f} us "
          f"{rows * k * 2 / linear_us / 1e3:6.0f} GB/s", flush=True)


def attention_case(layers, block_s_values):
    from targets.aoti.kernels import reference
    from targets.aoti.kernels.decode_attention import launch_decode_attention
    dt, heads, kvh, slots, dim = torch.float16, 32, 4, 512, 64
    for dtype in (torch.float16, torch.float32):
        q = torch.randn(1, heads, 1, dim, device="cuda", dtype=dtype)
        pk, pv = (torch.randn(1, kvh, slots, dim, device="cuda", dtype=dtype) for _ in "kv")
        nk, nv = (torch.randn(1, kvh, 1, dim, device="cuda", dtype=dtype) for _ in "kv")
        mask = torch.zeros(1, 1, 1, slots + 1, device="cuda", dtype=dtype)
        mask[..., 300:slots] = torch.finfo(dtype).min
        ref = reference.decode_attention(q, pk, nk, pv, nv, mask, dim ** -0.5).float()
        got = launch_decode_attention(q, pk, nk, pv, nv, mask, dim ** -0.5).float()
        sdpa = torch.nn.functional.scaled_dot_product_attention(
            q, torch.cat([pk, nk], 2), torch.cat([pv, nv], 2), attn_mask=mask,
            scale=dim ** -0.5, enable_gqa=True).float()
        print(f"attention {dtype}: rel.err {((got - ref).norm() / ref.norm()).item():.1e} "
              f"(SDPA's own {((sdpa - ref).norm() / ref.norm()).item():.1e})")
    caches = [[torch.randn(1, kvh, slots, dim, device="cuda", dtype=dt) for _ in "kv"]
              for _ in range(layers)]
    q = torch.randn(1, heads, 1, dim, device="cuda", dtype=dt)
    nk, nv = (torch.randn(1, kvh, 1, dim, device="cuda", dtype=dt) for _ in "kv")
    mask = torch.zeros(1, 1, 1, slots + 1, device="cuda", dtype=dt)
    for block_s in block_s_values:
        ms = graph_ms([lambda c=c, b=block_s: launch_decode_attention(q, c[0], nk, c[1], nv,
                                                                      mask, 0.125, b)
                       for c in caches])
        print(f"attention ours BLOCK_S {block_s}: {ms * 1000 / layers:6.2f} us a layer")
    ms = graph_ms([lambda c=c: torch.nn.functional.scaled_dot_product_attention(
        q, torch.cat([c[0], nk], 2), torch.cat([c[1], nv], 2), attn_mask=mask, scale=0.125,
        enable_gqa=True) for c in caches])
    print(f"attention cat + SDPA (as the step ran it): {ms * 1000 / layers:6.2f} us a layer")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--int8", action="store_true", help="the products over int8 rows")
    args = parser.parse_args()
    from targets.aoti.kernels.triton_kernels import gemv_config
    blocks = (512, 1024, 2048) if args.int8 else (256, 512)
    for name, n, k, norm, act, res in SHAPES:
        configs = {gemv_config(n, k, bool(act), False, 1 if args.int8 else 2)}
        if args.sweep:
            configs |= {(rows, block, warps, 0)  # as built: the loop alone
                        for rows, block, warps in itertools.product((2, 4, 8, 16), blocks,
                                                                    (4, 8))}
        gemv_case(name, n, k, norm, act, res, args.layers if name != "lm_head+norm" else 2,
                  sorted(configs), args.int8)
    if not args.int8:
        attention_case(args.layers, (16, 32, 64, 128) if args.sweep else (32,))


if __name__ == "__main__":
    main()
