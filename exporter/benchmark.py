"""``exporter bench``: the artifact and its baselines, timed in one process on the same inputs.

Accelerator times come from device events around each call after warm-up (CUDA events
on an NVIDIA GPU, through torch's device-generic ``torch.Event``); CPU times from
``perf_counter``. Medians, p10 and p90 over ``runs`` calls; ratios are taken within
the one run because the machines are shared and noisy. Then each partition is timed
inside the runtime, and the backends that can profile themselves time their nodes
(exporter/bench_detail.py); the machine, versions and input shapes go beside. The
baselines are eager by default: torch.compile's (``compile``) warm-up compiles, most of a
bench's time on a small CPU, so it runs when asked. A candidate whose p90 is past twice
its median is warned about (``warnings``): a busy machine, not the model.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import torch

import runtime
from exporter.bench_detail import (input_shapes, machine, op_times, partition_times, sample,
                                   stats)
from exporter.errors import UserInputError
from exporter.model.cast import CastModel
from exporter.model.given_module import factories_left_as_given
from exporter.model.hf_spec import HfOptions
from exporter.model.spec import load_spec
from exporter.report.speed import busy_machine, unstable
from exporter.validation.inputs import load_input_file
from exporter.progress import (ProgressCallback, StageHook, callback_stage, logged,
                               quiet_stage)
from runtime.program.base import check_inputs
from runtime.program.flat_inputs import flatten_inputs
from targets import all_targets
from targets.registry import described

log = logging.getLogger(__name__)
DEFAULT_BASELINES = ("eager",)
TORCH_BASELINES = ("eager", "compile")  # torch.compile(mode="reduce-overhead"): on request


def baseline_names() -> tuple[str, ...]:
    """eager and compile for every artifact; then those targets add (for their artifacts)."""
    return TORCH_BASELINES + tuple(name for card in described().values()
                                     for name in card.baselines)


def time_side_by_side(calls: dict[str, Callable[[], object]], device: str, runs: int,
                      warmup: int, rounds: int = 10, stage: StageHook = quiet_stage
                      ) -> dict[str, dict]:
    """Interleave the candidates in ``rounds`` blocks so that drift on a shared machine
    (clocks, other jobs) falls on all of them alike; medians and p90 per candidate. Each
    block starts with one untimed call (the previous candidate's thread pool may still
    spin on the same cores) and the order rotates each round, so no one always follows
    the same other."""
    for name, fn in calls.items():  # one stage each: torch.compile's compile happens here
        what = "; torch.compile compiles in the first" if name == "compile" else ""
        with stage(f"warm up {name} ({warmup} calls{what})"):
            for _ in range(warmup):
                fn()
            if device != "cpu":
                torch.accelerator.synchronize()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    per_round = max(1, runs // rounds)
    with stage(f"time {', '.join(calls)} ({runs} calls each, interleaved)"):
        names, turn = list(calls), 0
        while min(len(v) for v in samples.values()) < runs:
            for name in names[turn % len(names):] + names[:turn % len(names)]:
                calls[name]()  # settle: not timed
                samples[name] += [sample(calls[name], device) for _ in range(per_round)]
            turn += 1
    return {name: stats(values[:runs]) for name, values in samples.items()}


@factories_left_as_given()  # the eager baseline moves the spec's model and runs it
def bench(artifact: str | Path, *, model: str | None = None,
          baselines: tuple[str, ...] = DEFAULT_BASELINES, runs: int = 100, warmup: int = 20,
          cuda_graphs: bool = True, inputs: str | Path | None = None,
          batch_size: int | None = None, progress: ProgressCallback | None = None,
          stage: StageHook | None = None) -> dict:
    """Time the artifact and ``baselines`` side by side, on the model's example inputs, the
    arrays of ``inputs`` (an .npz named as the signature's inputs), or either with its
    dynamic batch made ``batch_size``. ``progress`` gets a StageEvent per stage (the CLI
    passes its spinner as ``stage`` instead); stages are logged too."""
    timed = logged(stage or callback_stage(progress))
    unknown = set(baselines) - set(baseline_names())
    if unknown:
        raise UserInputError(f"unknown baseline(s): {', '.join(sorted(unknown))}",
                             hint=f"choose from: {', '.join(baseline_names())}")
    if runs < 1:
        raise UserInputError("--runs must be at least 1")
    # The model first: importing it registers any custom ops the CPU fallback calls.
    with timed("load model"):
        spec = _spec(model, runtime.read_manifest(artifact))
    with timed("load artifact"):
        program = runtime.load(artifact, cuda_graphs=cuda_graphs)
    manifest = program.manifest
    device = manifest.partitions[0].device
    dtype = manifest.build.get("settings", {}).get("dtype", "fp32")
    results: dict = {"artifact": str(artifact), "target": manifest.target, "device": device,
                     "dtype": dtype, "cuda_graphs": cuda_graphs and device != "cpu",
                     "timer": f"{device}-events" if device != "cpu" else "perf_counter",
                     "runs": runs, "warmup": warmup, "timings": {}}
    if device != "cpu":
        results["gpu"] = torch.get_device_module(device).get_device_name()
    tensors = bench_inputs(spec, manifest, device, inputs, batch_size)
    results["machine"] = machine(program, device)
    results["inputs"] = input_shapes(program, tensors)
    with torch.inference_mode():
        calls = {"artifact": lambda: program.run(tensors, output_device=device)}
        calls.update(_baselines(spec, tensors, device, dtype, baselines))
        for target in all_targets().values():  # what a target adds: its backend, bare
            for name, make in target.tooling.baselines().items():
                if name in baselines:
                    calls[name] = make(program, tensors)
        results["timings"] = time_side_by_side(calls, device, runs, warmup, stage=timed)
        with timed(f"time each partition ({runs} calls)"):
            results["partitions"], given = partition_times(program, tensors, device, runs)
        with timed("profile the backends' nodes"):
            results["ops"] = op_times(Path(artifact), program, given, runs)
    art = results["timings"]["artifact"]["median_ms"]
    results["ratios"] = {f"artifact/{name}": art / t["median_ms"]
                         for name, t in results["timings"].items() if name != "artifact"}
    results["speedups"] = {name: t["median_ms"] / art
                           for name, t in results["timings"].items() if name != "artifact"}
    results["warnings"] = unstable(results["timings"]) + busy_machine(device)
    return results


def _spec(model: str | None, manifest):
    """The model to compare with: given, or the one the artifact was built from (an hf:
    spec with the task and sizes the build used)."""
    settings = manifest.build.get("settings", {})
    return load_spec(model or manifest.source["spec"],
                     HfOptions.from_settings(settings) if not model else None)


def bench_inputs(spec, manifest, device: str, path: str | Path | None,
                 batch_size: int | None) -> list[torch.Tensor]:
    """The example inputs or the file's, each input's dynamic dim 0 made ``batch_size``
    (its rows repeated), checked against the signature."""
    specs = manifest.signature.inputs
    tensors = (list(load_input_file(manifest.signature, Path(path)).values()) if path
               else flatten_inputs(spec.args, spec.kwargs).tensors)
    if batch_size is not None:
        batched = [s.shape and s.shape[0].is_dynamic for s in specs]
        if batch_size < 1 or not any(batched):
            raise UserInputError(
                f"--batch-size {batch_size}: " + ("give 1 or more" if batch_size < 1 else
                                                  "the artifact's inputs have no dynamic "
                                                  "batch (dim 0)"),
                hint="rebuild with --dynamic batch=1..N to time other batches")
        tensors = [t[torch.arange(batch_size) % t.shape[0]] if b else t
                   for t, b in zip(tensors, batched)]
        check_inputs(specs, tensors, where="--batch-size")
    return [t.to(device) for t in tensors]


def _baselines(spec, inputs: list[torch.Tensor], device: str, dtype: str,
               wanted: tuple[str, ...]) -> dict[str, Callable[[], object]]:
    if not wanted:
        return {}
    flat_module = _eager_in_dtype(spec, device, dtype)
    calls: dict[str, Callable[[], object]] = {}
    if not {"eager", "compile"} & set(wanted):
        return calls
    if "eager" in wanted:
        calls["eager"] = lambda: flat_module(*inputs)
    if "compile" in wanted:
        compiled = torch.compile(flat_module, mode="reduce-overhead")
        calls["compile"] = lambda: compiled(*inputs)
    return calls


def _eager_in_dtype(spec, device: str, dtype: str) -> Callable:
    """A callable on the flat inputs computing as eager does at the artifact's dtype:
    the model as the build captured it (``model.to(dtype)``, exporter/model/cast.py)."""
    module = spec.module if dtype == "fp32" else CastModel(spec.module, dtype)
    module = module.to(device)
    inputs = flatten_inputs(spec.args, spec.kwargs)

    def run(*flat):
        args, kwargs = inputs.rebuild(list(flat))
        return module(*args, **kwargs)
    return run
