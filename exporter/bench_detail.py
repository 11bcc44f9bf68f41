"""What `exporter bench` measures beside the side-by-side latencies: the machine and the
versions it ran on, each partition's own time inside the real runtime, and, where a
partition's backend can profile itself (ONNX Runtime's profiler), each node's time.

Also the two timing primitives bench is built on (one call's time, and the statistics
over many), so the partition times are taken exactly as the program's are.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from runtime.host.hostinfo import cpu_model
from targets import Tooling, for_backend

# Per partition, the slowest nodes kept from a backend's own profile: a transformer has
# thousands, and the page and the JSON should stay readable.
MAX_OPS_PER_PARTITION = 200


def sample(fn: Callable[[], object], device: str) -> float:
    """One call's time in ms: device events on an accelerator, perf_counter on the CPU."""
    if device != "cpu":
        start = torch.Event(device=device, enable_timing=True)
        end = torch.Event(device=device, enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    start_s = time.perf_counter()
    fn()
    return (time.perf_counter() - start_s) * 1e3


def stats(values: list[float]) -> dict:
    """Median, p10 and p90 (nearest rank), min, and how many."""
    values = sorted(values)

    def rank(share: float) -> float:
        return values[min(len(values) - 1, int(share * len(values)))]
    return {"median_ms": statistics.median(values), "p10_ms": rank(0.1), "p90_ms": rank(0.9),
            "min_ms": values[0], "runs": len(values)}


def machine(program, device: str) -> dict:
    """Where the figures were taken: CPU model, cores, threads, GPU, versions."""
    threads: dict[str, Any] = {"torch": torch.get_num_threads()}
    backends = {p.name: p.backend for p in program.manifest.partitions}
    for name, report in program.backend_reports.items():
        if "intra_op_threads" in report:  # a backend's own pool (runtime/executors/ort_threads.py)
            threads[backends[name]] = report["intra_op_threads"]
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {"cpu": cpu_model() or platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "usable_cores": affinity, "threads": threads,
            "gpu": (torch.get_device_module(device).get_device_name()
                    if device != "cpu" else None),
            "os": platform.platform(terse=True), "versions": _versions(program)}


def _versions(program) -> dict[str, str | None]:
    """Python, torch, and the installed version of each package a partition runs on."""
    found = {"python": platform.python_version(), "torch": torch.__version__}
    for partition in program.manifest.partitions:
        target = for_backend(partition.backend)
        for name in (target.packaging.runtime_packages(partition) if target else {}):
            try:
                found[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                found[name] = None
    return found


def partition_times(program, inputs: list[torch.Tensor], device: str, runs: int
                    ) -> tuple[dict[str, dict], dict[str, list]]:
    """Each partition's executor call timed inside ``program.run`` (device events on a
    GPU), ``runs`` calls after a few untimed ones; and each partition's last inputs."""
    partitions = {p.name: p for p in program.manifest.partitions}
    with program.timing_partitions(sample) as record:
        for _ in range(max(3, runs // 10)):
            program.run(inputs, output_device=device)
        for name in record:
            record[name]["ms"].clear()
        for _ in range(runs):
            program.run(inputs, output_device=device)
    times = {name: {"backend": partitions[name].backend, "device": partitions[name].device,
                    **stats(rec["ms"])} for name, rec in record.items()}
    return times, {name: rec["inputs"] for name, rec in record.items()}


def op_times(artifact: Path, program, partition_inputs: dict[str, list], runs: int
             ) -> dict[str, list[dict]]:
    """Per partition whose target can profile its backend (``Tooling.op_times``): its
    nodes' times, slowest first (at most MAX_OPS_PER_PARTITION)."""
    from runtime.format.archive import ArtifactReader

    found: dict[str, list[dict]] = {}
    wanted = [(p, target) for p in program.manifest.partitions  # only those that can
              for target in [for_backend(p.backend)]                # (no needless copies)
              if target is not None and type(target.tooling).op_times is not Tooling.op_times]
    if not wanted:
        return found
    with ArtifactReader.open(artifact) as reader:
        for partition, target in wanted:
            inputs = [t.detach().cpu() for t in partition_inputs.get(partition.name, [])]
            if not inputs and partition.inputs:
                continue
            folder = reader.extract_private(partition.files)
            rows = target.tooling.op_times(folder, partition, inputs, runs)
            if rows:
                rows = sorted(rows, key=lambda row: -row["median_ms"])
                found[partition.name] = rows[:MAX_OPS_PER_PARTITION]
    return found


def input_shapes(program, inputs: list[torch.Tensor]) -> list[dict]:
    return [{"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
            for name, t in zip(program.input_names, inputs)]
