"""Where a cuda fp16 artifact's time goes against torch.compile(reduce-overhead) and eager,
and how build variants move it: each model's candidates interleaved in one process.

    python bench/cuda_gap.py --models vit_b_16,deit_small,gpt2_small --json-out OUT.jsonl \
        --variants 'before={"skip_passes": ["patch_convs_as_matmuls"]};after={}' \
        --time-cores 12-15

A variant is a name and Inductor settings laid over what the cuda target passes, less
the passes its ``skip_passes`` names, plus the candidate passes its ``add_passes`` names,
with only the attention backends its ``sdpa_backends`` names enabled while it builds
(``{}``: the target as it is; the default compares the target without and with the
rewrites session 61 made default). Every (model,
variant) build is its own process (the whole build, validation included, bench/cuda_jobs.py),
all at once; beside them one measuring process per model compiles its baselines
(``compile``: the model cast as the build casts it, torch.compile(mode="reduce-overhead");
``eager``), loads the builds as they finish and warms everything up. When every model is
ready (or at ``--barrier-s``), the measuring processes take the GPU one at a time, on
``--time-cores``: candidates timed side by side with CUDA events
(``exporter.benchmark.time_side_by_side``: medians over ``--runs`` calls after warm-up)
and profiled over ``--profile-calls`` calls: kernels per call, GPU time per kernel class
(GEMM, attention, Triton, copies, other) and the kernels with the most time. One JSON row
per model goes to ``--json-out`` as soon as it is measured; ``--progress`` gets a line per
finished build and model. ``--device cpu`` runs the same path on the cpu target (fp32,
AOTInductor; variants must be ``{}``, no profile): the path checked without a GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cuda_jobs import build_one, note, run_jobs, time_on_gpu, write_result  # noqa: E402

# the cuda target without and with its three newest default conv/GELU rewrites
BEFORE_AFTER = ('before={"skip_passes": ["depthwise_convs_as_taps", '
                '"grouped_convs_as_batched_gemms", "tanh_gelu_as_gemm_epilogue"]};after={}')
CLASSES = (  # first match wins: a Triton GEMM template is a GEMM, not a Triton kernel
    ("attention", re.compile(r"flash|fmha|attention|attn", re.I)),
    ("gemm", re.compile(r"gemm|xmma|cutlass|cublas|sm90_|sm80_|triton_tem|_mm_|mm_kernel"
                        r"|splitk|splitK|nvjet", re.I)),
    ("triton", re.compile(r"^triton_")),
    ("copy", re.compile(r"memcpy|memset|copy|cat", re.I)),
)


def kernel_class(name: str) -> str:
    return next((label for label, pattern in CLASSES if pattern.search(name)), "other")


def profile(call, calls: int, top_n: int = 12) -> dict:
    """Kernels per call and GPU microseconds per call by class, and the ``top_n`` kernels."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    per_class, per_kernel, count = defaultdict(float), defaultdict(lambda: [0, 0.0]), 0
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = event.time_range.elapsed_us()
        count += 1
        per_class[kernel_class(event.name)] += us
        per_kernel[event.name][0] += 1
        per_kernel[event.name][1] += us
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1][1])[:top_n]
    return {"kernels_per_call": count / calls,
            "us_per_call": {k: round(v / calls, 1) for k, v in sorted(per_class.items())},
            "busy_us_per_call": round(sum(per_class.values()) / calls, 1),
            "top": [{"kernel": k[:120], "class": kernel_class(k), "per_call": n / calls,
                     "us_per_call": round(us / calls, 1)} for k, (n, us) in top]}


def measure(name: str, variants: dict[str, dict], args) -> dict:
    """One model's measuring process: baselines compiled and every build loaded and warmed
    while other models build, then timed and profiled when this process holds the GPU."""
    import runtime
    from bench.cuda_jobs import wait_for_build
    from bench.cuda_models import model_spec
    from exporter.benchmark import _baselines, time_side_by_side
    from exporter.model.spec import load_spec
    from runtime.program.flat_inputs import flatten_inputs

    device, dtype = ("cuda", "fp16") if args.device == "cuda" else ("cpu", "fp32")
    spec = load_spec(model_spec(name))
    inputs = [t.to(device) for t in flatten_inputs(spec.args, spec.kwargs).tensors]
    with torch.inference_mode():
        calls = _baselines(spec, inputs, device, dtype, tuple(args.baselines.split(",")))
        failed = warm_baselines(calls, args.warmup, device)  # compile compiles here
        note(args, {"model": name, "baselines_ready": list(calls)})
        baselines = set(calls)
        builds = {v: wait_for_build(name, v, args) for v in variants}

        def runs(program):
            return lambda: program.run(inputs, output_device=device)
        for variant, built in builds.items():
            if "path" in built:
                calls[variant] = runs(runtime.load(built["path"]))
            if "path" in built and args.plain_launches:  # the host code's speed, no graph
                try:
                    calls[f"{variant}-plain"] = runs(runtime.load(built["path"],
                                                                  cuda_graphs=False))
                except Exception as exc:  # noqa: BLE001 - the graphed build still times
                    failed[f"{variant}-plain"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        warm({v: call for v, call in calls.items() if v not in baselines}, args.warmup, device)
        with time_on_gpu(name, args):
            timings = time_side_by_side(calls, device, args.runs, args.warmup)
            profiles = ({label: profile(call, args.profile_calls, args.profile_top)
                         for label, call in calls.items()}
                        if device == "cuda" and args.profile_calls else {})
    base = next((timings[k]["median_ms"] for k in ("compile", "eager") if k in timings), None)
    return {"model": name, "spec": model_spec(name), "builds": builds, "timings": timings,
            "vs": {v: round(timings[v]["median_ms"] / base, 3) for v in timings
                   if v not in baselines} if base else None,
            "vs_baseline": next((k for k in ("compile", "eager") if k in timings), None),
            "profiles": profiles, "baseline_errors": failed}


def warm_baselines(calls: dict, times: int, device: str) -> dict[str, str]:
    """Warm each baseline; one that cannot run the model is dropped from ``calls`` and its
    error returned (torch.compile's CUDA graphs refuse a model that keeps a graph output
    across calls, as timm's TinyViT keeps its attention biases): the rest still time."""
    failed = {}
    for name in list(calls):
        try:
            warm({name: calls[name]}, times, device)
        except Exception as exc:  # noqa: BLE001 - any failure of a peer is its own result
            failed[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
            del calls[name]
    return failed


def warm(calls: dict, times: int, device: str) -> None:
    for call in calls.values():
        for _ in range(times):
            call()
    if device != "cpu":
        torch.cuda.synchronize()


def parse_variants(text: str) -> dict[str, dict]:
    variants = {}
    for part in filter(None, text.split(";")):
        name, _, settings = part.partition("=")
        variants[name.strip()] = json.loads(settings or "{}")
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="vit_b_16,gpt2_small")
    parser.add_argument("--variants", default=BEFORE_AFTER,
                        help="name=JSON;... (a model:variant name limits it to that model)")
    parser.add_argument("--baselines", default="eager,compile")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--plain-launches", action="store_true",
                        help="also time each build without CUDA graphs (<variant>-plain)")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--profile-calls", type=int, default=20)
    parser.add_argument("--profile-top", type=int, default=12,
                        help="kernels listed in each profile, the most time first")
    parser.add_argument("--work-dir", default="build/cuda-gap")
    parser.add_argument("--json-out", default="build/cuda-gap/rows.jsonl")
    parser.add_argument("--progress", help="a line per finished build and model")
    parser.add_argument("--compile-threads", type=int, default=4,
                        help="Inductor's compile workers in each process")
    parser.add_argument("--barrier-s", type=float, default=360,
                        help="seconds after the start when timing begins though some model "
                             "is not ready")
    parser.add_argument("--deadline-s", type=float, default=540,
                        help="seconds after the start when unfinished processes are ended")
    parser.add_argument("--build-gpus", help="GPUs the builds take in turn, e.g. 0,1 "
                        "(their kernel tuning runs there); timing on the first")
    parser.add_argument("--time-cores", help="cores the measuring process holds while it "
                        "times, e.g. 12-15 (default: as started)")
    parser.add_argument("--build-one", help=argparse.SUPPRESS)  # a build process's job
    parser.add_argument("--measure-one", help=argparse.SUPPRESS)  # a measuring process's model
    parser.add_argument("--start", type=float, help=argparse.SUPPRESS)  # the parent's clock
    args = parser.parse_args()
    if args.build_one:  # one build: the result to --json-out
        write_result(args.json_out, build_one(json.loads(args.build_one), args))
        return
    if args.measure_one:
        name = args.measure_one
        row = {**header(args), **measure(name, variants_for(name, args), args)}
        note(args, {"model": name, "vs": row["vs"], "vs_baseline": row["vs_baseline"],
                    "ms": {k: round(v["median_ms"], 4) for k, v in row["timings"].items()},
                    "kernels": {k: p["kernels_per_call"] for k, p in row["profiles"].items()},
                    "classes": {k: p["us_per_call"] for k, p in row["profiles"].items()}},
             row=row)
        return
    run_jobs(args, [(name, variants_for(name, args)) for name in args.models.split(",")])


def variants_for(name: str, args) -> dict[str, dict]:
    """The variants built for ``name``: those whose name is plain or ``name:...``."""
    chosen = {}
    for label, settings in parse_variants(args.variants).items():
        model, _, short = label.rpartition(":")
        if not model or model == name:
            chosen[short] = settings
    return chosen


def header(args) -> dict:
    from bench.common import machine_header
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if args.device == "cuda":
        versions["gpu"] = torch.cuda.get_device_name()
    return {**machine_header(**versions), "variants": args.variants, "runs": args.runs,
            "argv": " ".join(sys.argv[1:])}


if __name__ == "__main__":
    main()
