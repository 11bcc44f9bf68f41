"""``exporter bench``: the artifact and its baselines, timed in one process on the same inputs.

GPU times come from CUDA events around each call after warm-up; CPU times from
``perf_counter``. Medians and p90 over ``runs`` calls; ratios are taken within
the one run because the machines are shared and noisy.
"""

from __future__ import annotations

import copy
import logging
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

import runtime
from exporter.capture import capture, flatten_inputs
from exporter.errors import UserInputError
from exporter.spec import load_spec
from passes.cast_dtype import DTYPES, CastFloatDtype

log = logging.getLogger(__name__)
BASELINES = ("eager", "compile")


def time_calls(fn: Callable[[], object], device: str, runs: int, warmup: int) -> dict:
    for _ in range(warmup):
        fn()
    samples = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
    else:
        for _ in range(runs):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
    samples.sort()
    return {"median_ms": statistics.median(samples),
            "p90_ms": samples[min(len(samples) - 1, int(0.9 * len(samples)))],
            "min_ms": samples[0], "runs": runs}


def bench(artifact: str | Path, *, model: str | None = None, baselines: tuple[str, ...] = BASELINES,
          runs: int = 100, warmup: int = 20, cuda_graphs: bool = True) -> dict:
    unknown = set(baselines) - set(BASELINES)
    if unknown:
        raise UserInputError(f"unknown baseline(s): {', '.join(sorted(unknown))}",
                             hint=f"choose from: {', '.join(BASELINES)}")
    if runs < 1:
        raise UserInputError("--runs must be at least 1")
    program = runtime.load(artifact, cuda_graphs=cuda_graphs)
    manifest = program.manifest
    device = manifest.partitions[0].device
    dtype = manifest.build.get("settings", {}).get("dtype", "fp32")
    results: dict = {"artifact": str(artifact), "target": manifest.target, "device": device,
                     "dtype": dtype, "cuda_graphs": cuda_graphs and device == "cuda",
                     "timer": "cuda-events" if device == "cuda" else "perf_counter",
                     "runs": runs, "warmup": warmup, "timings": {}}
    if device == "cuda":
        results["gpu"] = torch.cuda.get_device_name()
    spec = load_spec(model or manifest.source["spec"]) if baselines or model else None
    inputs = _inputs(spec, manifest, device)
    with torch.inference_mode():
        results["timings"]["artifact"] = time_calls(
            lambda: program.run(inputs, output_device=device), device, runs, warmup)
        for name, fn in _baselines(spec, inputs, device, dtype, baselines).items():
            results["timings"][name] = time_calls(fn, device, runs, warmup)
    art = results["timings"]["artifact"]["median_ms"]
    results["ratios"] = {f"artifact/{name}": art / t["median_ms"]
                         for name, t in results["timings"].items() if name != "artifact"}
    return results


def _inputs(spec, manifest, device: str) -> list[torch.Tensor]:
    if spec is None:
        raise UserInputError("bench needs the model to build inputs",
                             hint="pass --model SPEC")
    tensors = flatten_inputs(spec.args, spec.kwargs).tensors
    return [t.to(device) for t in tensors]


def _baselines(spec, inputs: list[torch.Tensor], device: str, dtype: str,
               wanted: tuple[str, ...]) -> dict[str, Callable[[], object]]:
    if not wanted:
        return {}
    flat_module = _eager_in_dtype(spec, device, dtype)
    calls: dict[str, Callable[[], object]] = {}
    if "eager" in wanted:
        calls["eager"] = lambda: flat_module(*inputs)
    if "compile" in wanted:
        compiled = torch.compile(flat_module, mode="reduce-overhead")
        calls["compile"] = lambda: compiled(*inputs)
    return calls


def _eager_in_dtype(spec, device: str, dtype: str) -> Callable:
    """A callable on the flat inputs computing as eager does at the artifact's dtype:
    ``model.to(dtype)`` with inputs cast, or, where that fails (float32 masks mixed
    with half weights), the dtype-cast program run eagerly."""
    module = spec.module.to(device)
    inputs = flatten_inputs(spec.args, spec.kwargs)
    if dtype == "fp32":
        def run_fp32(*flat):
            args, kwargs = inputs.rebuild(list(flat))
            return module(*args, **kwargs)
        return run_fp32
    half = copy.deepcopy(module).to(DTYPES[dtype])

    def run_half(*flat):
        cast = [t.to(DTYPES[dtype]) if t.is_floating_point() else t for t in flat]
        args, kwargs = inputs.rebuild(cast)
        return half(*args, **kwargs)

    try:
        with torch.inference_mode():
            run_half(*[t.to(device) for t in inputs.tensors])
        return run_half
    except RuntimeError as exc:
        log.warning("eager %s failed (%s); timing the cast program eagerly instead", dtype, exc)
        captured = capture(spec, [], device)
        return CastFloatDtype(dtype)(captured.program).program.module()
