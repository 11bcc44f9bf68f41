"""On the GPU machine: the pieces of a batch-1 fp16 decode step, timed alone (a working
tool for issue 23's cuda goal, not a benchmark table).

    python bench/decode_kernels_microbench.py [--layers 22]

For the ~1.1B LLaMA shape's matrix-vector products it compares cuBLAS (``F.linear``) with
the same product written as a multiply-and-sum that Inductor turns into a Triton reduction
(untuned and coordinate-descent tuned, as the cuda target builds it), and with Inductor's
max-autotune GEMM templates. For the decode attention it compares transformers' SDPA over
repeated key/value heads with the query heads packed onto their key/value head.

Every figure is a CUDA graph of one call per layer, each layer with its own weights (so
L2 holds none of them between calls), replayed after warm-up: CUDA events, median of 50.
GB/s is the weight bytes read per call over the time.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

SHAPES = {"qkv": (2048, 2560), "o": (2048, 2048), "gate_up": (2048, 11264),
          "down": (5632, 2048), "lm_head": (2048, 32000)}


def graph_time(calls, warm: int = 3, runs: int = 50) -> float:
    """Median milliseconds of one replay of a CUDA graph that makes every call in ``calls``."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warm):
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    for _ in range(5):
        graph.replay()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def taking_turns(calls: dict, rounds: int) -> dict:
    """Median us of each call's CUDA graph, the graphs replayed in turns (five replays
    each a turn, every other round in reverse): variants a few percent apart are told
    apart in one process, not one after the other."""
    graphs = {}
    for name, call in calls.items():
        call()
        torch.cuda.synchronize()
        graphs[name] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[name]):
            call()
        graphs[name].replay()
    times: dict = {name: [] for name in graphs}
    for round_ in range(rounds):
        for name in list(graphs) if round_ % 2 == 0 else list(reversed(graphs)):
            for _ in range(5):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                graphs[name].replay()
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end) * 1000)
    return {name: statistics.median(us) for name, us in times.items()}


def gemv_variants() -> dict:
    import torch._inductor.config as inductor

    def mul_sum(x, w):  # fp32 products and sum, as Inductor computes a reduction anyway
        return (x.float() * w.float()).sum(-1).to(x.dtype)

    # torch.compile compiles at a function's first call (and again for new shapes), so
    # the settings wrap the calls, not the torch.compile line
    tuned = inductor.patch(coordinate_descent_tuning=True)
    autotune = inductor.patch(max_autotune=True, max_autotune_gemm_backends="TRITON,ATEN")
    return {"cublas": lambda x, w: F.linear(x, w),
            "reduction": torch.compile(mul_sum, dynamic=False),
            "reduction tuned": tuned(torch.compile(mul_sum, dynamic=False)),
            "max_autotune": autotune(torch.compile(lambda x, w: F.linear(x, w),
                                                   dynamic=False))}


def gemvs(layers: int) -> None:
    variants = gemv_variants()
    for name, (k, n) in SHAPES.items():
        count = 1 if name == "lm_head" else layers
        weights = [torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
                   for _ in range(count)]
        x = torch.randn(1, k, device="cuda", dtype=torch.float16)
        reference = F.linear(x, weights[0]).float()
        row = []
        for label, fn in variants.items():
            try:
                err = (fn(x, weights[0]).float() - reference).abs().max().item()
                ms = graph_time([lambda w=w, fn=fn: fn(x, w) for w in weights])
            except Exception as exc:  # noqa: BLE001 - a variant that fails is reported
                row.append(f"{label}: failed {type(exc).__name__}: {str(exc)[:120]}")
                continue
            per = ms / count * 1000
            gbs = n * k * 2 / (per * 1e-6) / 1e9
            row.append(f"{label} {per:6.1f} us {gbs:6.0f} GB/s (err {err:.1e})")
        print(f"{name:8s} [{k}->{n}] x{count}: " + " | ".join(row), flush=True)


def attention(layers: int, slots: int = 513) -> None:
    from transformers.integrations.sdpa_attention import repeat_kv
    heads, kv_heads, dim = 32, 4, 64
    q = torch.randn(1, heads, 1, dim, device="cuda", dtype=torch.float16)
    caches = [(torch.randn(1, kv_heads, slots, dim, device="cuda", dtype=torch.float16),
               torch.randn(1, kv_heads, slots, dim, device="cuda", dtype=torch.float16))
              for _ in range(layers)]
    mask = torch.zeros(1, 1, 1, slots, device="cuda", dtype=torch.float16)
    mask[..., 300:] = torch.finfo(torch.float16).min

    def repeated(k, v):
        return F.scaled_dot_product_attention(q, repeat_kv(k, 8), repeat_kv(v, 8),
                                              attn_mask=mask)

    def packed(k, v):  # [1, heads, 1, d] -> [1, kv_heads, 8, d]: one key/value head a group
        out = F.scaled_dot_product_attention(q.view(1, kv_heads, 8, dim), k, v,
                                             attn_mask=mask)
        return out.view(1, heads, 1, dim)

    def gqa(k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    reference = repeated(*caches[0]).float()
    for label, fn in (("repeat_kv + SDPA", repeated), ("packed GQA SDPA", packed),
                      ("SDPA enable_gqa", gqa),
                      ("compiled repeat_kv + SDPA", torch.compile(repeated)),
                      ("compiled packed", torch.compile(packed))):
        try:
            err = (fn(*caches[0]).float() - reference).abs().max().item()
            ms = graph_time([lambda c=c, fn=fn: fn(*c) for c in caches])
            print(f"attention {label:28s}: {ms / layers * 1000:6.1f} us a layer "
                  f"(err {err:.1e})", flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"attention {label}: failed {type(exc).__name__}: {str(exc)[:160]}")


def down_with_its_prologue(layers: int) -> None:
    """The down projection's input is SiLU(gate) * up: Inductor inlines that into the
    reduction's loads (every block of outputs recomputes it) unless it is made apart."""
    import torch._inductor.config as inductor

    def fused(gate_up, w):
        gate, up = gate_up.split(5632, -1)
        row = (F.silu(gate) * up).float()
        return (row * w.float()).sum(-1).to(gate_up.dtype)

    def prologue(gate_up):
        gate, up = gate_up.split(5632, -1)
        return F.silu(gate) * up

    def reduction(row, w):
        return (row.float() * w.float()).sum(-1).to(row.dtype)

    weights = [torch.randn(2048, 5632, device="cuda", dtype=torch.float16) * 0.02
               for _ in range(layers)]
    gate_up = torch.randn(1, 11264, device="cuda", dtype=torch.float16)
    for tuned in (False, True):
        # the setting wraps the calls: torch.compile compiles at the first one
        patch = inductor.patch(coordinate_descent_tuning=tuned)
        one = patch(torch.compile(fused, dynamic=False))
        first, second = (patch(torch.compile(prologue, dynamic=False)),
                         patch(torch.compile(reduction, dynamic=False)))
        variants = {"inlined": lambda w, one=one: one(gate_up, w),
                    "apart": lambda w, first=first, second=second: second(first(gate_up), w)}
        for label, fn in variants.items():
            ms = graph_time([lambda w=w, fn=fn: fn(w) for w in weights])
            print(f"down with SiLU*up {label:8s} coordinate descent {tuned}: "
                  f"{ms / layers * 1000:6.1f} us a layer", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--only", choices=("attention", "gemv", "down"))
    args = parser.parse_args()
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    parts = {"attention": attention, "gemv": gemvs, "down": down_with_its_prologue}
    for name, part in parts.items():
        if args.only in (None, name):
            part(args.layers)


if __name__ == "__main__":
    main()
