"""On the GPU machine: the ~1.1B LLaMA-shaped decode step per kernel, with each kernel's
own bytes, and the decode speed against the memory-bandwidth bound.

    python bench/decode_step_cuda.py --out DIR --builds fp16[,fp16-int8-weight,...]
        [--variant before|after|rows-written|flags-off|inputs-copied|int4-split] [--ncu]
        [--validate]
        [--build-only | --measure-only]

For each build: the artifact (``exporter.build``, the cuda target; ``before`` without the
decode-kernel passes, ``after`` as the target is, ``rows-written`` with the new K/V rows
written by the runtime after the step, ``flags-off`` without the greedy token in the
head's kernel, with each attention and o as two launches and the rows written by the
runtime; ``inputs-copied`` with the step's next token and position copied and added by
the runtime after the head's token kernel (not written by it); ``int4-split`` with torch's
argmax after the head and each attention and o as two launches at int4 weights),
``exporter bench``'s decode tokens/s
(no baselines: 128-token prompt, 128 new tokens, median of 3 runs after a warm-up), the
decode CUDA graph's replay time (CUDA events, median of 200 calls one at a time, and a
replay's share of 20 back to back, as greedy decoding runs them), the kernels of 20 replays
(torch.profiler: name, calls and microseconds a step) and, with ``--ncu``, one replay
under Nsight Compute (--clock-control none): each kernel's DRAM bytes and its own time.
The bound: the step's weight bytes over 4.8 TB/s (the H200's datasheet bandwidth).
Rows go to DIR/decode-step.jsonl; a table per build is printed. With
``EDGE_EXPORTER_PLAIN_LAUNCHES=1`` set, a build makes a library without dependent
launches, and a measurement starts the same library's kernels plainly (the row says). ``--build-only`` and
``--measure-only`` split the two halves, so builds can run side by side (in separate
processes, each with its own DIR) and be timed one at a time on a quiet GPU afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from targets.aoti.kernels.dependent_launch import PLAIN_ENV  # noqa: E402

BANDWIDTH = 4.8e12
DECODE_PASSES = ("decode_attention_as_kernel", "row_linears_as_kernels")
# the head's kernel is the last of a step's row kernels (head_argmax_kernel: greedy steps)
ROW_KERNELS = ("row_gemv_kernel", "row_loop_kernel", "split_gemv_kernel", "pipe_gemv_kernel",
               "int4_row_gemv_kernel", "head_argmax_kernel", "int4_head_argmax_kernel")
# Variants as the cuda target's generation facet with fields changed: "rows-written" with
# the step's new K/V rows written by the runtime after the step, not stored by the
# attention + o launch; "flags-off" with the greedy token in the head, the attention
# joined with o and the rows stored all off (the target before they were on);
# "inputs-copied" with the step's next inputs copied and added after the head's token
# kernel, not written by it (the target before advance_inputs was on);
# "int4-split" with torch's argmax after the head and the attention and o as two
# launches at int4 weights (the target before int4_fused was on); "x-float" with the
# int8 products with the norm folded reading x as floats (before int8_x_codes was on)
VARIANTS = ("before", "after", "rows-written", "flags-off", "inputs-copied", "int4-split",
            "x-float")
FLAGS = {"rows-written": {"store_rows": False},
         "flags-off": {"next_token": False, "attention_o": False,
                       "store_rows": False, "advance_inputs": False},
         "inputs-copied": {"advance_inputs": False},
         "int4-split": {"int4_fused": False},
         "x-float": {"int8_x_codes": False}}  # Generation's fields
BUILDS = {"fp16": dict(dtype="fp16"),
          "fp16-int8-weight": dict(dtype="fp16", quantize="int8-weight", min_top1=0.5),
          # random weights' flat logits: int4's rounding alone flips most near-ties, more
          # the more layers (bench/int4_rows_gate.py), so top-1 tells nothing; KL does
          "fp16-int4-weight": dict(dtype="fp16", quantize="int4-weight", min_top1=0.0,
                                   max_kl=0.3)}


def step_bytes(folder: Path, build: str) -> float:
    """Weight bytes a decode step reads: every layer's products and the head (the token
    table gives one row), at the build's bytes per weight."""
    config = json.loads((folder / "config.json").read_text())
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    kv = h // config["num_attention_heads"] * config["num_key_value_heads"]
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * i
    weights = layers * per_layer + h * config["vocab_size"]
    per_weight = {"fp16": 2.0, "fp16-int8-weight": 1.0 + 2.0 / h,
                  "fp16-int4-weight": 0.5 + 4.0 / 128}[build]
    return weights * per_weight


def build(folder: Path, name: str, variant: str, out: Path, validate: bool) -> dict:
    import exporter
    from targets.aoti.cuda import CudaTarget
    settings = dict(BUILDS[name])
    if not validate:
        settings["validate_artifact"] = False
    original, generation = CudaTarget.default_passes, CudaTarget.generation
    if variant == "before":
        CudaTarget.default_passes = lambda self, options: [
            p for p in original(self, options) if p.name not in DECODE_PASSES]
    if variant in FLAGS:
        CudaTarget.generation = dataclasses.replace(generation, **FLAGS[variant])
    artifact = out / f"llama-1b-{name}-{variant}.artifact"
    start = time.perf_counter()

    def progress(event) -> None:
        # each stage's start and end: a build stopped at its limit says where it was
        print(f"[{time.perf_counter() - start:5.0f} s] {event.stage} {event.state} "
              f"({event.seconds:.0f} s)", flush=True)
    try:
        built = exporter.build(f"hf:{folder}", task="text-generation", target="cuda",
                               max_context=512, prefill_chunk=256, out=artifact,
                               progress=progress, **settings)
    finally:
        CudaTarget.default_passes, CudaTarget.generation = original, generation
    record = built.manifest.validation or {}
    decode = built.manifest.entry_points.get("decode")
    passes = decode.passes if decode is not None else []
    return {"artifact": str(artifact), "build_s": round(time.perf_counter() - start),
            "validation": {k: record.get(k) for k in ("passed", "top1_agreement", "mean_kl",
                                                      "tokens_identical")},
            "passes": [p for p in passes if p.get("name") in DECODE_PASSES]}


def bench(artifact: str) -> dict:
    from exporter.lm.bench import bench_generation
    result = bench_generation(artifact, baselines=(), runs=3,
                              stage=lambda name: contextlib.nullcontext())
    row = result["engines"]["artifact"]
    return {"decode_tok_s": row["decode_tokens_per_s"], "ttft_ms": row.get("ttft_s", 0) * 1e3}


def graph_of(artifact: str):
    import runtime
    program = runtime.load(artifact)
    generator = program.generator
    generator.prefill_prompt(list(range(3, 131)))
    graph = generator._graph
    for position in range(128, 140):
        graph(5, position)
    torch.cuda.synchronize()
    return program, graph


def replay_median_ms(graph, calls: int = 200) -> float:
    """The median of ``calls`` replays of a decode step's CUDA graph, each at its own
    position, timed with CUDA events."""
    times = []
    for i in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph(5, 140 + i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def replay_back_to_back_ms(graph, steps: int = 20, windows: int = 15) -> float:
    """A decode step's time as greedy decoding runs it: ``steps`` replays of the graph
    enqueued back to back between two CUDA events (the graph advances its own token and
    position), the median over ``windows`` of the time a replay. replay_median_ms times
    one call at a time, the host's fills of token and position and the launch included."""
    graph(5, 140)
    times = []
    for _ in range(windows):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph(5, 140)  # each window from the same position
        start.record()
        for _ in range(steps):
            graph._graph.replay()  # the captured step alone, as greedy enqueues it
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / steps)
    return statistics.median(times)


def replay_and_profile(artifact: str, layers: int) -> dict:
    _, graph = graph_of(artifact)
    replay = replay_median_ms(graph)
    back_to_back = replay_back_to_back_ms(graph)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(20):
            graph(5, 360 + i)
        torch.cuda.synchronize()
    kernels = defaultdict(lambda: [0, 0.0])
    sequence = []  # (name, us) in launch order
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[key(event.name)][0] += 1
            kernels[key(event.name)][1] += event.time_range.elapsed_us()
            sequence.append((event.time_range.start, key(event.name),
                             event.time_range.elapsed_us(), event.time_range.end))
    sequence.sort()
    own = own_times(sequence)
    sequence = [(name, us) for _, name, us, _ in sequence]
    return {"replay_ms": replay, "replay_back_to_back_ms": back_to_back,
            "kernels": {k: [n / 20, us / 20] for k, (n, us) in kernels.items()},
            "by_position": by_position(sequence, layers), "step": step_kernels(sequence, 20),
            "by_position_own": by_position(own, layers), "step_own": step_kernels(own, 20)}


def own_times(sequence: list) -> list:
    """(name, us) of each kernel's own share of the step: its end minus the later of its
    start and the previous kernel's end. A dependent launch starts before its predecessor
    ends and waits inside, so its profiled duration counts that wait too."""
    found, last_end = [], None
    for start, name, _, end in sequence:
        begin = start if last_end is None else max(start, last_end)
        found.append((name, max(end - begin, 0)))
        last_end = end if last_end is None else max(last_end, end)
    return found


def step_kernels(sequence: list, steps: int) -> list:
    """Each kernel of one step in launch order, its median time over the steps: the
    per-kernel table of any build (int4's products are not row_gemv)."""
    per_step, left = divmod(len(sequence), steps)
    if left:
        return []
    return [[sequence[i][0], statistics.median(sequence[i + s * per_step][1]
                                               for s in range(steps))]
            for i in range(per_step)]


def by_position(sequence: list, layers: int) -> dict:
    """A kernel launched several times a layer (row_gemv or int4 rows: q/k/v, o, gate/up,
    down, then the head), its median time at each place in the layer's order."""
    calls = [us for name, us in sequence if name.startswith(ROW_KERNELS)]
    per_step = 4 * layers + 1
    steps = [calls[i:i + per_step] for i in range(0, len(calls) - per_step + 1, per_step)]
    if not steps or len(calls) % per_step:  # not 4 products a layer (attention-o: 3)
        return {}
    places = ("qkv", "o", "gate_up", "down")
    found = {place: statistics.median(us for step in steps for us in step[i:-1:4])
             for i, place in enumerate(places)}
    found["lm_head"] = statistics.median(step[-1] for step in steps)
    return found


def key(name: str) -> str:
    return re.sub(r"^void ", "", name).split("(")[0].split("<")[0][:70]


def ncu_child(artifact: str) -> None:
    _, graph = graph_of(artifact)
    torch.cuda.cudart().cudaProfilerStart()
    graph(5, 150)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def ncu(artifact: str, out: Path) -> dict:
    tool = shutil.which("ncu") or next(iter(sorted(Path("/opt/nvidia").glob(
        "nsight-compute/*/ncu"))), None)
    if tool is None:
        return {"error": "no ncu"}
    log = out / f"ncu-{Path(artifact).stem}.csv"
    cmd = [str(tool), "--clock-control", "none", "--profile-from-start", "off",
           "--print-units", "base", "--csv", "--log-file", str(log), "--metrics",
           "gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum",
           sys.executable, __file__, "--ncu-child", artifact]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    except subprocess.TimeoutExpired:
        return {"error": "ncu ran past 150 s"}
    if not log.exists():
        return {"error": done.stderr[-800:] + done.stdout[-800:]}
    text = log.read_text()
    lines = text[text.find('"ID"'):]
    per = defaultdict(lambda: defaultdict(float))
    names = {}
    for row in csv.DictReader(io.StringIO(lines)):
        value = float(row["Metric Value"].replace(",", "") or 0)
        per[row["ID"]][row["Metric Name"]] += value
        names[row["ID"]] = key(row["Kernel Name"])
    kernels = defaultdict(lambda: [0, 0.0, 0.0])
    rows = []  # row_gemv's (us, bytes) in launch order
    for kid, metrics in sorted(per.items(), key=lambda kv: int(kv[0])):
        entry = kernels[names[kid]]
        moved = metrics["dram__bytes_read.sum"] + metrics["dram__bytes_write.sum"]
        entry[0] += 1
        entry[1] += metrics["gpu__time_duration.sum"] / 1e3
        entry[2] += moved
        if names[kid].startswith(ROW_KERNELS):
            rows.append((metrics["gpu__time_duration.sum"] / 1e3, moved))
    places = {}
    if len(rows) % 4 == 1:
        for i, place in enumerate(("qkv", "o", "gate_up", "down")):
            places[place] = [statistics.median(r[0] for r in rows[i:-1:4]),
                             statistics.median(r[1] for r in rows[i:-1:4])]
        places["lm_head"] = list(rows[-1])
    return {"kernels": {k: list(v) for k, v in kernels.items()}, "by_position": places}


def table(label: str, row: dict) -> None:
    prof = row["profile"]["kernels"]
    counters = row.get("ncu", {}).get("kernels", {})
    total_us = sum(us for _, us in prof.values())
    print(f"\n### {label}: {row['bench']['decode_tok_s']:.1f} tok/s (bench), replay "
          f"{row['profile']['replay_ms']:.3f} ms (back to back "
          f"{row['profile'].get('replay_back_to_back_ms', float('nan')):.3f}), kernels "
          f"{sum(n for n, _ in prof.values()):.0f}"
          f" a step, busy {total_us:.0f} us; bound {row['bound_tok_s']:.0f} tok/s "
          f"({row['step_bytes'] / 1e9:.2f} GB); bench at "
          f"{row['bench']['decode_tok_s'] / row['bound_tok_s']:.0%} of bound; ncu bytes a step "
          f"{sum(v[2] for v in counters.values()) / 1e9:.2f} GB")
    for field, what in (("by_position", "row_gemv by place, us"),
                        ("by_position_own", "row_gemv by place, own us")):
        if row["profile"].get(field):
            print(f"{what}: " + ", ".join(
                f"{k} {v:.2f}" for k, v in row["profile"][field].items()))
    print("| kernel | calls/step | us/step (graph) | us/call | ncu us/call | MB/call | GB/s |")
    print("|---|---|---|---|---|---|---|")
    for name, (calls, us) in sorted(prof.items(), key=lambda kv: -kv[1][1])[:22]:
        n, ncu_us, nbytes = counters.get(name, (0, 0.0, 0.0))
        per_call = us / calls
        mb = nbytes / n / 1e6 if n else float("nan")
        print(f"| {name[:60]} | {calls:.0f} | {us:.1f} | {per_call:.2f} | "
              f"{(ncu_us / n) if n else float('nan'):.2f} | {mb:.2f} | "
              f"{(mb * 1e6 / per_call / 1e3) if n else float('nan'):.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--builds", default="fp16")
    parser.add_argument("--variant", default="after", choices=VARIANTS)
    parser.add_argument("--ncu", action="store_true")
    parser.add_argument("--validate", action="store_true")
    parser.add_argument("--layers", type=int, help="that many of the 1.1B's 22 layers (a "
                        "quicker build of the same layer)")
    parser.add_argument("--ncu-child")
    phase = parser.add_mutually_exclusive_group()
    phase.add_argument("--build-only", action="store_true")
    phase.add_argument("--measure-only", action="store_true",
                       help="time DIR's artifacts of an earlier --build-only")
    args = parser.parse_args()
    if args.ncu_child:
        return ncu_child(args.ncu_child)
    from bench.common import machine_header
    from bench.generation_cuda import big_checkpoint
    args.out.mkdir(parents=True, exist_ok=True)
    folder = args.out / "llama-1b"
    if not folder.exists():
        big_checkpoint(folder, "1b", 0.02, args.layers)
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    for name in args.builds.split(","):
        row = {**machine_header(torch=torch.__version__), "build": name,
               "variant": args.variant, "gpu": torch.cuda.get_device_name(),
               # set while building: a library without dependent launches; while
               # measuring: the same library's kernels all started plainly
               "plain_launches": bool(os.environ.get(PLAIN_ENV))}
        try:
            if args.measure_only:
                row["artifact"] = str(args.out / f"llama-1b-{name}-{args.variant}.artifact")
            else:
                row.update(build(folder, name, args.variant, args.out, args.validate))
            if args.build_only:
                print(json.dumps({k: row.get(k) for k in ("build", "build_s", "validation",
                                                          "passes")}), flush=True)
                with open(args.out / "decode-builds.jsonl", "a") as fh:
                    fh.write(json.dumps(row) + "\n")
                continue
            row["bench"] = bench(row["artifact"])
            row["profile"] = replay_and_profile(row["artifact"], layers)
        except Exception as exc:  # noqa: BLE001 - recorded; the next build runs
            row["error"] = f"{type(exc).__name__}: {exc}"[:3000]
            print(json.dumps(row)[:3000], flush=True)
            continue
        row["step_bytes"] = step_bytes(folder, name)
        row["bound_tok_s"] = BANDWIDTH / row["step_bytes"]
        print(json.dumps({k: row[k] for k in ("build", "variant", "build_s", "validation",
                                               "bench", "passes") if k in row}), flush=True)
        launches = "plain launches" if row["plain_launches"] else "as built"
        table(f"{name} {args.variant}, {launches}", row)
        with open(args.out / "decode-step.jsonl", "a") as fh:
            fh.write(json.dumps(row) + "\n")
        if args.ncu:  # last: the rows above are kept if it runs out of time
            row["ncu"] = ncu(row["artifact"], args.out)
            table(f"{name} {args.variant} with ncu's bytes", row)
            print("ncu row_gemv by place (us, MB): " + json.dumps(
                {k: [round(v[0], 2), round(v[1] / 1e6, 2)]
                 for k, v in row["ncu"].get("by_position", {}).items()}), flush=True)
            with open(args.out / "decode-step.jsonl", "a") as fh:
                fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
