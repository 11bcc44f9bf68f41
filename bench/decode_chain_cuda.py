"""On the GPU machine: a ~1.1B LLaMA decode step's chain of the cuda target's own kernels
(targets/aoti/kernels/), launched as plain launches and as programmatic dependent launches.

    python bench/decode_chain_cuda.py [--layers 22] [--slots 512] [--out FILE]
        [--int8 | --int4] [--best SWEEP.jsonl [--search N]] [--variants A,B,...]
        [--rounds N]

Each layer is what the built step runs of ours, in order and feeding each other: q/k/v
(RMSNorm folded in) -> attention over a 512-slot cache (split + join) -> o (+ residual)
-> gate/up (norm, SiLU x up) -> down (+ residual); then the head (final norm). Every
layer has its own weights and cache (L2 holds none between calls). The chain is one CUDA
graph, replayed after warm-up (CUDA events, median of 50); torch.profiler then gives
each kernel's time in it. The step's other kernels (token embedding, rotary, the mask,
argmax, the cache write) are not in it. Variants change one thing at a time: the launch
(plain or dependent), the weight columns loaded ahead of the wait (AHEAD), the attention's
past rows read before or after it, its join in the split kernel, and the small products'
block configuration, and weights prefetched into L2 from a side branch of the graph
(decode_chain_prefetch.py); a product as a row loop (decode_chain_rowloop.py) or split
along K (decode_chain_split.py: a configuration that is a launch of its own), or a flag in place
of the wait at a boundary (decode_chain_flag.py). Each variant's outputs are compared with the same kernels' plain
launches: a dependent launch that read before the kernel before had written would differ
("plain + join": what the join alone changes, a rounding).
"As built" is the configuration a built library runs (gemv_config's plain one: no columns
ahead, the loop alone); the other variants load the dependent launch's AHEAD columns.
``--int8``: the products over int8 rows with a scale a row (``--quantize int8-weight``;
down split along K in the dependent variants, on counters, as a library runs it);
``--int4``: over int4 rows as an int4 build launches them (decode_chain_int4.py: q/k/v
with its rotary embedding folded in, ``int4 ...`` variants);
``--best``: plain and dependent launches with each product's fastest configuration in a
bench/decode_gemv_sweep.py run (its rows at the same weight width); ``--search N``: the
configurations chosen in the chain instead, from each product's N fastest alone (search).
``--rounds N``: then the chosen variants' graphs replayed in turns, N rounds, each
variant's median against the first's (variants a few percent apart, told apart in one
process).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.decode_kernels_microbench import graph_time, taking_turns  # noqa: E402

HIDDEN, KV, INTER, VOCAB, HEADS, KV_HEADS, DIM = 2048, 256, 5632, 32000, 32, 4, 64
PRODUCTS = {"qkv": (HIDDEN + 2 * KV, HIDDEN, 0), "o": (HIDDEN, HIDDEN, 0),
            "gate_up": (INTER, HIDDEN, 1), "down": (HIDDEN, INTER, 0),
            "head": (VOCAB, HIDDEN, 0)}


def weights(layers: int, slots: int, int8: bool = False) -> dict:
    def w(rows, cols):
        if int8:  # the rows and a scale a row, as the int8 products take them
            return (torch.randint(-127, 128, (rows, cols), device="cuda", dtype=torch.int8),
                    torch.rand(rows, device="cuda", dtype=torch.float16) * 2e-4 + 1e-4)
        return torch.randn(rows, cols, device="cuda", dtype=torch.float16) * 0.02, None
    made = {"layers": [], "norm": torch.rand(HIDDEN, device="cuda", dtype=torch.float16) + 0.5}
    for _ in range(layers):
        made["layers"].append({
            "qkv": w(HIDDEN + 2 * KV, HIDDEN), "o": w(HIDDEN, HIDDEN),
            "gate_up": w(2 * INTER, HIDDEN), "down": w(HIDDEN, INTER),
            "k": torch.randn(1, KV_HEADS, slots, DIM, device="cuda", dtype=torch.float16),
            "v": torch.randn(1, KV_HEADS, slots, DIM, device="cuda", dtype=torch.float16)})
    made["head"] = w(VOCAB, HIDDEN)
    mask = torch.zeros(1, 1, 1, slots + 1, device="cuda", dtype=torch.float16)
    mask[..., slots * 3 // 4:slots] = torch.finfo(torch.float16).min
    made["mask"] = mask
    made["counts"] = torch.zeros(KV_HEADS, device="cuda", dtype=torch.int32)
    # a product split along K (int8 down, as a library splits it): a count a block of rows
    made["split_counts"] = torch.zeros(HIDDEN, device="cuda", dtype=torch.int32)
    return made


def step(made: dict, hidden: torch.Tensor, pdl: bool, configs: dict,
         cache_ahead: bool | None = None, join: bool = False,
         block_s: int | None = None, hook=None, mlp=None) -> torch.Tensor:
    from targets.aoti.kernels.decode_attention import launch_decode_attention
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    norm = made["norm"]

    def gemv(name, x, weight, **fold):
        rows, scale = weight
        if callable(configs.get(name)):  # a variant's own kernel (decode_chain_split.py)
            return configs[name](x, rows, scale, fold, pdl)
        # counters as a library gives them: launch_row_gemv splits where its config says
        return launch_row_gemv(x, rows, None, fold.get("norm"), fold.get("residual"), 1e-5,
                               0.0, fold.get("act", 0), configs.get(name), pdl, scale,
                               counts=made.get("split_counts"))
    hook = hook or (lambda stage, layer: None)  # a variant's launches around the chain's
    h = hidden
    for layer in made["layers"]:
        hook("qkv", layer)
        qkv = gemv("qkv", h, layer["qkv"], norm=norm)
        q = qkv[..., :HIDDEN].view(1, HEADS, 1, DIM)
        k = qkv[..., HIDDEN:HIDDEN + KV].view(1, KV_HEADS, 1, DIM)
        v = qkv[..., HIDDEN + KV:].view(1, KV_HEADS, 1, DIM)
        hook("attention", layer)
        # a variant's one launch for the attention and o (decode_attention_o.py), or None
        both = configs.get("attention_o")
        o = both(q, k, v, h, layer, made, pdl) if both else None
        if o is None:
            if "attention" in configs:  # a variant's own attention (decode_chain_flag.py)
                att = configs["attention"].attention(q, k, v, layer, made, pdl)
            else:
                att = launch_decode_attention(q, layer["k"], k, layer["v"], v, made["mask"],
                                              DIM ** -0.5, pdl=pdl, cache_ahead=cache_ahead,
                                              counts=made["counts"] if join else None,
                                              block_s=block_s)
            if mlp is not None:  # a variant's own kernel for o -> gate/up -> down
                h = mlp(att.view(1, 1, HIDDEN), h, layer, norm, pdl)
                continue
            o = gemv("o", att.view(1, 1, HIDDEN), layer["o"], residual=h)
        gated = gemv("gate_up", o, layer["gate_up"], norm=norm, act=1)
        h = gemv("down", gated, layer["down"], residual=o)
    out = gemv("head", h, made["head"], norm=norm)
    hook("end", None)
    return out


def per_kernel(calls, layers: int | None = None) -> tuple[dict, dict]:
    """us a step for each kernel name, from torch.profiler over 10 replays of a graph;
    with ``layers``, each product's and the attention's own time (own_by_place)."""
    from torch.profiler import ProfilerActivity, profile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            graph.replay()
        torch.cuda.synchronize()
    found: dict = {}
    sequence = []
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            name = event.name.split("(")[0]
            found[name] = found.get(name, 0.0) + event.time_range.elapsed_us() / 10
            sequence.append((event.time_range.start, name, 0, event.time_range.end))
    if not layers:
        return found, {}
    # a layer of five kernels, or four (the attention and o one launch)
    return found, (own_by_place(sorted(sequence), layers)
                   or own_by_place(sorted(sequence), layers, FOUR_PLACES))


PLACES = ("qkv", "attention", "o", "gate_up", "down")
FOUR_PLACES = ("qkv", "attention+o", "gate_up", "down")


def own_by_place(sequence: list, layers: int, places: tuple = PLACES) -> dict:
    """Median own us (decode_step_cuda.own_times: its end less the later of its start and
    the kernel before's end) of each place in a layer, over layers and replays, where
    every replay is a kernel a place a layer and the head (else {})."""
    from bench.decode_step_cuda import own_times
    per_replay = len(places) * layers + 1
    if not sequence or len(sequence) % per_replay:
        return {}
    own = [us for _, us in own_times(sequence)]
    found = {place: statistics.median(
        us for r in range(0, len(own), per_replay)
        for us in own[r + i:r + per_replay - 1:len(places)]) for i, place in enumerate(places)}
    found["head"] = statistics.median(own[r + per_replay - 1]
                                      for r in range(0, len(own), per_replay))
    return found


def _launch_options(given: list) -> tuple:
    """A variant's (cache_ahead, join, block_s, hook, mlp): those it gives, in order,
    then the defaults."""
    return (*given, *(None, False, None, None, None)[len(given):])


def swept(path: Path, int8: bool, keep: int = 1) -> dict:
    """Each product's ``keep`` fastest configurations alone in a sweep's rows (within the
    error gate), fastest first."""
    names = {"qkv+norm": "qkv", "o+res": "o", "gate_up+norm+silu": "gate_up",
             "down+res": "down", "lm_head+norm": "head"}
    timed: dict = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["int8"] == int8 and row["rel_err"] < 2e-3:
            timed.setdefault(names[row["product"]], {})[tuple(row["config"])] = row["us"]
    return {name: sorted(configs, key=configs.get)[:keep] for name, configs in timed.items()}


def search(time_of, start: dict, candidates: dict, margin: float = 0.01) -> tuple:
    """Coordinate descent over the chain: one product at a time, each candidate
    configuration in place of its current one, kept if the whole chain's time drops by
    more than ``margin`` (a product's configuration also moves the gaps around it, so
    the fastest alone need not be fastest here). Returns (configs, us, trials)."""
    best, best_us = dict(start), time_of(start)
    trials = [(dict(best), best_us)]
    for name, configs in candidates.items():
        for config in configs:
            if config == best[name]:
                continue
            trial = {**best, name: config}
            us = time_of(trial)
            trials.append((trial, us))
            if us < best_us * (1 - margin):
                best, best_us = trial, us
    return best, best_us, trials


def searched(made: dict, hidden: torch.Tensor, start: dict, candidates: dict) -> dict:
    """search() with the chain's plain launches timed (median of 30 replays)."""
    def time_of(configs):
        return graph_time([lambda: step(made, hidden, False, configs)], warm=2,
                          runs=30) * 1000
    found, us, trials = search(time_of, start, candidates)
    for configs, trial_us in trials:
        changed = {name: c for name, c in configs.items() if c != start[name]}
        print(f"  search {trial_us:7.1f} us  {changed or 'as built'}", flush=True)
    print(f"  search kept {us:.1f} us: {found}", flush=True)
    return found


def variants(best: Path | None = None, int8: bool = False) -> dict:
    from bench.decode_attention_o import attention_o_variants
    from bench.decode_attention_short import short_variants
    from bench.decode_chain_dot4 import dot4_variants
    from bench.decode_chain_flag import flag_variants
    from bench.decode_chain_persistent import persistent_variants
    from bench.decode_chain_prefetch import prefetch_variants
    from bench.decode_chain_rowloop import row_loop_variants
    from bench.decode_chain_split import split_variants
    from bench.decode_pipe_gemv import pipe_variants
    from bench.head_argmax_triton import argmax_variants
    from targets.aoti.kernels.triton_kernels import gemv_config
    size = 1 if int8 else 2
    built = {name: gemv_config(n, k, bool(act), False, size)
             for name, (n, k, act) in PRODUCTS.items()}
    # what a built library runs on this GPU (a gated product's row loop among them)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # (o and down, with no norm or gate, are given counters as a library gives them, and
    # may stream their rows through shared memory)
    default = {name: gemv_config(n, k, bool(act), True, size, sms,
                                 splittable=name in ("o", "down"),
                                 streamable=name in ("o", "down"))
               for name, (n, k, act) in PRODUCTS.items()}
    if best is not None:
        fastest = {name: configs[0] for name, configs in swept(best, int8).items()}
        return {"as built": (False, built), "fastest of the sweep": (False, fastest),
                "fastest of the sweep, dependent": (True, fastest)}
    no_ahead = {name: (*c[:3], 16) for name, c in default.items()}
    small4 = {**default, "qkv": (2, 512, 4, 2048), "o": (2, 512, 4, 2048)}
    gate2 = {**default, "gate_up": (2, 512, 4, 2048), "down": (2, 512, 4, 2048)}
    gate4 = {**default, "gate_up": (4, 256, 4, 1024)}
    small8 = {**default, "qkv": (2, 512, 8, 2048)}
    # the layer's attention and o in one launch (as a library runs them now)
    joined_o = attention_o_variants(default)
    return {"plain, as built": (False, built),
            "plain": (False, default), "plain, 16 columns ahead": (False, no_ahead),
            "dependent": (True, default),
            # the attention's past rows after its wait, as a built library reads them
            "dependent + cache after the wait": (True, default, False),
            # the attention's blocks joined inside its split kernel (one kernel a layer)
            "plain + join": (False, default, None, True),
            "dependent + join": (True, default, None, True),
            "dependent + cache after the wait + join": (True, default, False, True),
            **{f"dependent + join {slots} slots a block": (True, default, None, True, slots)
               for slots in (16, 64, 128)},
            "dependent, 16 columns ahead": (True, no_ahead),
            "dependent, small products 4 warps": (True, small4),
            "dependent, q/k/v 2 rows 8 warps": (True, small8),
            "dependent, gate_up 4 rows": (True, gate4),
            "dependent, gate_up/down 2 rows 4 warps": (True, gate2),
            # weights prefetched into L2 by a side branch of the graph
            **prefetch_variants(default),
            # o -> gate/up -> down as one persistent kernel with grid barriers
            **persistent_variants(default),
            # a product as a row loop, or the one-block kernel in another shape
            **row_loop_variants(default),
            # a product split along K, its parts joined by the last to finish
            **split_variants(default),
            # down or q/k/v streaming its weights through shared memory (cp.async)
            **pipe_variants(default),
            # a flag the kernel before counts in on, in place of gdc_wait
            **flag_variants(default),
            # the attention in few, long blocks (one a key/value head: no join)
            **short_variants(default),
            # a layer's attention and o as one launch
            **joined_o,
            # int8 products over x's int8 codes, four products a dp4a
            **dot4_variants(joined_o),
            # ending with the token: torch's argmax after the head, or inside its kernel
            **argmax_variants(default)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--slots", type=int, default=512)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--variants", help="comma-separated variant names (default: all)")
    parser.add_argument("--int8", action="store_true", help="the products over int8 rows")
    parser.add_argument("--int4", action="store_true", help="the products over int4 rows")
    parser.add_argument("--best", type=Path, help="a decode_gemv_sweep.py run's rows")
    parser.add_argument("--search", type=int, default=0, metavar="N",
                        help="with --best: search the chain over each product's N fastest "
                             "configurations alone, then time what it found as a variant")
    parser.add_argument("--rounds", type=int, default=0,
                        help="then the chosen variants' graphs replayed in turns this many "
                             "rounds (the first variant is the baseline)")
    args = parser.parse_args()
    if args.search and args.best is None:
        parser.error("--search needs --best (a decode_gemv_sweep.py run's rows)")
    if args.int4 and (args.int8 or args.best):
        parser.error("--int4 takes neither --int8 nor --best")
    torch.manual_seed(0)
    made = weights(args.layers, args.slots, args.int8)
    if args.int4:  # Triton's own launches: imported only here
        from bench import decode_chain_int4 as int4
        made = int4.int4_weights(made)
    hidden = torch.randn(1, 1, HIDDEN, device="cuda", dtype=torch.float16)
    byte_count = sum(t.numel() * t.element_size() for w in [made["head"]] + [
        w for layer in made["layers"] for key, w in layer.items() if key not in ("k", "v")]
        for t in w if t is not None)
    rows = []
    chosen = int4.int4_variants() if args.int4 else variants(args.best, args.int8)
    if args.int4:  # a layer's attention and o as one launch, over int4 rows
        from bench.decode_attention_o import attention_o_int4_variants
        chosen.update(attention_o_int4_variants(chosen))
    if args.variants:
        chosen = {name: chosen[name] for name in args.variants.split(",")}
    if args.search:
        start = variants(args.best, args.int8)["as built"][1]
        chosen["searched in the chain"] = (False, searched(
            made, hidden, start, swept(args.best, args.int8, args.search)))
    for label, (pdl, configs, *cache) in chosen.items():
        ahead, join, block_s, hook, mlp = _launch_options(cache)
        out = step(made, hidden, pdl, configs, ahead, join, block_s, hook, mlp).float()
        differs = (out - step(made, hidden, False, configs).float()).abs().max().item()
        ms = graph_time([lambda: step(made, hidden, pdl, configs, ahead, join, block_s,
                                      hook, mlp)], warm=2, runs=50)
        kernels, own = per_kernel(
            lambda: step(made, hidden, pdl, configs, ahead, join, block_s, hook, mlp),
            args.layers)
        row = {"variant": label, "int8": args.int8, "int4": args.int4,
               "dependent_launch": pdl,
               "configs": configs, "ms": ms,
               "weight_gb": byte_count / 1e9, "tb_s": byte_count / ms / 1e9,
               "max_abs_diff_vs_plain_launch": differs, "kernels_us": kernels,
               "own_us": own,
               "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
        rows.append(row)
        if args.out:  # each variant as it comes: a run cut short keeps what it measured
            with open(args.out, "a") as fh:
                fh.write(json.dumps(row, default=repr) + "\n")
        print(f"{label:42s} {ms * 1000:7.1f} us  {row['tb_s']:.2f} TB/s  "
              f"max|diff| vs plain launch {differs:.1e}  " + ", ".join(
                  f"{k} {v:.0f}" for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])),
              flush=True)
        if own:
            print(f"{'':42s} own us: " + ", ".join(f"{k} {v:.2f}" for k, v in own.items()),
                  flush=True)
    if args.rounds:
        calls = {}
        for label, (pdl, configs, *cache) in chosen.items():
            ahead, join, block_s, hook, mlp = _launch_options(cache)
            calls[label] = (lambda pdl=pdl, configs=configs, ahead=ahead, join=join,
                            block_s=block_s, hook=hook, mlp=mlp: step(
                                made, hidden, pdl, configs, ahead, join, block_s, hook,
                                mlp))
        turns = taking_turns(calls, args.rounds)
        first = next(iter(turns.values()))
        for label, us in turns.items():
            print(f"in turns, {args.rounds} rounds: {label:52s} {us:7.1f} us  "
                  f"{us / first:.4f}", flush=True)
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(json.dumps({"taking_turns": turns, "rounds": args.rounds}) + "\n")
    best = min(rows, key=lambda r: r["ms"])
    print(f"fastest: {best['variant']} {best['ms'] * 1000:.1f} us a chain "
          f"({statistics.median(r['ms'] for r in rows) * 1000:.1f} median of variants)")


if __name__ == "__main__":
    main()
