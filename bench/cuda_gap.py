"""Where a cuda fp16 artifact's time goes against torch.compile(reduce-overhead), and how
build variants move it: one process per run, each model's candidates interleaved.

    python bench/cuda_gap.py --models vit_b_16,deit_small,gpt2_small --json-out OUT.jsonl \
        --variants 'before={"skip_passes": ["patch_convs_as_matmuls"]};after={}' --build-jobs 4

A variant is a name and Inductor settings laid over what the cuda target passes, less
the passes its ``skip_passes`` names (``{}``: the target as it is; the default compares
the target without and with its depthwise and attention-input rewrites). Each model is
built once per variant (the whole build, validation included; ``--build-jobs`` builds run
at once, in their own processes, before any timing), then the artifacts and ``compile`` (the model cast as the build
casts it, torch.compile(mode="reduce-overhead")) are timed side by side with CUDA events
(``exporter.benchmark.time_side_by_side``: medians over ``--runs`` calls after warm-up),
and each is profiled over ``--profile-calls`` calls: kernels per call, GPU time per
kernel class (GEMM, attention, Triton, copies, other) and the kernels with the most time.
One JSON row per model goes to ``--json-out`` as soon as it is measured.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import machine_header  # noqa: E402

# the cuda target without its depthwise and attention-input rewrites, and as it is
BEFORE_AFTER = ('before={"skip_passes": ["depthwise_convs_as_taps", '
                '"attention_inputs_as_views"]};after={}')
CLASSES = (  # first match wins: a Triton GEMM template is a GEMM, not a Triton kernel
    ("attention", re.compile(r"flash|fmha|attention|attn", re.I)),
    ("gemm", re.compile(r"gemm|xmma|cutlass|cublas|sm90_|sm80_|triton_tem|_mm_|mm_kernel"
                        r"|splitk|splitK|nvjet", re.I)),
    ("triton", re.compile(r"^triton_")),
    ("copy", re.compile(r"memcpy|memset|copy|cat", re.I)),
)


def kernel_class(name: str) -> str:
    return next((label for label, pattern in CLASSES if pattern.search(name)), "other")


def with_variant(overrides: dict):
    """The cuda target's Inductor settings with ``overrides`` laid over them, less the
    passes named in ``overrides["skip_passes"]``, for one build; returns the originals."""
    from targets.aoti.cuda import CudaTarget
    overrides = dict(overrides)
    skipped = set(overrides.pop("skip_passes", ()))
    original = CudaTarget.inductor_configs, CudaTarget.default_passes

    def configs(self, options, dynamic=False, data_sizes=False):
        return {**original[0](self, options, dynamic, data_sizes), **overrides}

    def passes(self, options):
        return [p for p in original[1](self, options) if p.name not in skipped]
    CudaTarget.inductor_configs, CudaTarget.default_passes = configs, passes
    return original


def build_variant(name: str, spec: str, variant: str, overrides: dict, work: Path) -> dict:
    from exporter.builder.pipeline import build
    from exporter.settings import BuildSettings
    from targets.aoti.cuda import CudaTarget

    out = work / f"{name}-{variant}.artifact"
    original = with_variant(overrides)
    start = time.perf_counter()
    try:
        built = build(spec, BuildSettings(target="cuda", dtype="fp16", out=out))
    finally:
        CudaTarget.inductor_configs, CudaTarget.default_passes = original
    return {"path": str(out), "build_s": round(time.perf_counter() - start, 1),
            "lower_s": built.timings.get("lower (aoti)"),
            "validated": built.manifest.validation["passed"]}


def build_all(names: list[str], variants: dict[str, dict], args) -> dict[str, dict]:
    """Every (model, variant) build: in this process one after another, or
    ``args.build_jobs`` at a time each in a fresh Python process (a build is mostly CPU
    work: Inductor's code generation, the C++ compile). A build that fails is recorded as
    its error; each finished build is printed with the seconds since the first began."""
    from concurrent.futures import ThreadPoolExecutor

    from bench.models import SUITE
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    jobs = [(name, SUITE[name], v, o, str(work)) for name in names for v, o in variants.items()]
    start = time.perf_counter()

    def one(job: tuple) -> dict:
        built = _build_in_process(job) if args.build_jobs > 1 else _build_here(*job)
        print(json.dumps({"model": job[0], "variant": job[2], "at_s":
                          round(time.perf_counter() - start), **built}), flush=True)
        return built
    if args.build_jobs > 1:
        with ThreadPoolExecutor(args.build_jobs) as pool:
            results = list(pool.map(one, jobs))
    else:
        results = [one(job) for job in jobs]
    builds: dict[str, dict] = {name: {} for name in names}
    for (name, _, variant, _, _), built in zip(jobs, results):
        builds[name][variant] = built
    return builds


def _build_here(name: str, spec: str, variant: str, overrides: dict, work: str) -> dict:
    try:
        return build_variant(name, spec, variant, overrides, Path(work))
    except Exception as exc:  # one failed build leaves the others to measure
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def _build_in_process(job: tuple) -> dict:
    """One build in a child Python; its result comes back through a file, its output goes
    to a log: a pipe would wait for every process that inherited it (compile workers)."""
    import subprocess
    result = Path(job[4]) / f"{job[0]}-{job[2]}.json"
    result.unlink(missing_ok=True)
    with open(result.with_suffix(".log"), "w") as log:
        subprocess.run([sys.executable, __file__, "--build-one", json.dumps(job),
                        "--json-out", str(result)], stdout=log, stderr=subprocess.STDOUT,
                       stdin=subprocess.DEVNULL, cwd=ROOT)
    if not result.exists():
        return {"error": result.with_suffix(".log").read_text()[-400:]}
    return json.loads(result.read_text())


def profile(call, calls: int) -> dict:
    """Kernels per call and GPU microseconds per call by class, and the top kernels."""
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
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1][1])[:12]
    return {"kernels_per_call": count / calls,
            "us_per_call": {k: round(v / calls, 1) for k, v in sorted(per_class.items())},
            "busy_us_per_call": round(sum(per_class.values()) / calls, 1),
            "top": [{"kernel": k[:120], "class": kernel_class(k), "per_call": n / calls,
                     "us_per_call": round(us / calls, 1)} for k, (n, us) in top]}


def measure(name: str, builds: dict[str, dict], args) -> dict:
    import runtime
    from bench.models import SUITE
    from exporter.benchmark import _baselines, time_side_by_side
    from exporter.model.spec import load_spec
    from runtime.program.flat_inputs import flatten_inputs

    spec_text = SUITE[name]
    built_ok = {v: b for v, b in builds.items() if "path" in b}
    spec = load_spec(spec_text)
    inputs = [t.cuda() for t in flatten_inputs(spec.args, spec.kwargs).tensors]
    with torch.inference_mode():
        calls = _baselines(spec, inputs, "cuda", "fp16", () if args.no_compile else ("compile",))
        for variant, built in built_ok.items():
            program = runtime.load(built["path"])
            calls[variant] = (lambda p: lambda: p.run(inputs, output_device="cuda"))(program)
        timings = time_side_by_side(calls, "cuda", args.runs, args.warmup)
        profiles = {label: profile(call, args.profile_calls) for label, call in calls.items()}
    compile_ms = timings["compile"]["median_ms"] if "compile" in timings else None
    return {"model": name, "spec": spec_text, "builds": builds, "timings": timings,
            "vs_compile": {v: round(timings[v]["median_ms"] / compile_ms, 3)
                           for v in built_ok} if compile_ms else None,
            "profiles": profiles}


def parse_variants(text: str) -> dict[str, dict]:
    variants = {}
    for part in filter(None, text.split(";")):
        name, _, settings = part.partition("=")
        variants[name.strip()] = json.loads(settings or "{}")
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="vit_b_16,gpt2_small")
    parser.add_argument("--variants", default=BEFORE_AFTER)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--profile-calls", type=int, default=20)
    parser.add_argument("--work-dir", default="build/cuda-gap")
    parser.add_argument("--json-out", default="build/cuda-gap/rows.jsonl")
    parser.add_argument("--build-jobs", type=int, default=1)
    parser.add_argument("--no-compile", action="store_true",
                        help="time the artifacts only (no torch.compile baseline)")
    parser.add_argument("--build-one", help=argparse.SUPPRESS)  # a build_all worker's job
    args = parser.parse_args()
    if args.build_one:  # a build_all worker: the result to --json-out
        Path(args.json_out).write_text(json.dumps(_build_here(*json.loads(args.build_one))))
        return
    variants = parse_variants(args.variants)
    header = {**machine_header(torch=torch.__version__, cuda=torch.version.cuda),
              "gpu": torch.cuda.get_device_name(), "variants": variants, "runs": args.runs}
    names = args.models.split(",")
    builds = build_all(names, variants, args)
    for name in names:
        try:
            row = {**header, **measure(name, builds[name], args)}
        except Exception as exc:  # the other models are still measured
            print(json.dumps({"model": name, "error": f"{type(exc).__name__}: {exc}"[:400]}),
                  flush=True)
            continue
        with open(args.json_out, "a") as sink:
            sink.write(json.dumps(row) + "\n")
        brief = {"model": name, "vs_compile": row["vs_compile"],
                 "ms": {k: round(v["median_ms"], 4) for k, v in row["timings"].items()},
                 "kernels": {k: p["kernels_per_call"] for k, p in row["profiles"].items()},
                 "classes": {k: p["us_per_call"] for k, p in row["profiles"].items()}}
        print(json.dumps(brief), flush=True)


if __name__ == "__main__":
    main()
