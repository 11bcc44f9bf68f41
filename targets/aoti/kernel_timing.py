"""How Inductor times a Triton kernel's configurations while the cuda target compiles.

Coordinate-descent tuning (targets/aoti/cuda.py) picks each kernel's block sizes by
timing them, and Inductor times a kernel as a pair of CUDA events around its launch,
each launch enqueued from Python after an L2 flush. A batch-1 decode step's kernels
run for about as long as a launch from Inductor's Python launcher costs the host. On a
slower or busier host the GPU finishes the flush and the start event before the launch
arrives, so the event pair times the host's enqueue, every candidate looks the same, and
the choice is noise: one build's kernels came out half again slower on some machines
than on others (docs/design-notes.md).

``host_independent_kernel_timing()`` times the same calls with the GPU held back: a
GPU-side sleep long enough for the host to enqueue every timed call first, so the GPU
then runs them back to back and each event pair brackets the kernel alone. It swaps
the benchmarker that Inductor's Triton autotuner uses for one of the same class with
this ``benchmark_gpu``, only for the compile it wraps; Inductor offers no setting for
it (its profiler-based benchmarker, where a torch has it, is chosen once at import and
costs a profiler session per candidate). Where the torch in use lays Inductor out
differently, nothing is swapped and Inductor times as it does (``swapped`` says which).
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

log = logging.getLogger(__name__)
# GPU clock cycles a second, above data-center GPUs' boost clocks: the sleep
# only has to be long enough, and a longer one costs build time, not accuracy.
_CYCLES_PER_SECOND = 2.5e9
_RUNS = 100
_BUDGET_SECONDS = 0.025  # the timed calls of one candidate, as Inductor's own budget


def queued_kernel_ms(call: Callable[[], Any], runs: int = _RUNS) -> float:
    """Median milliseconds of ``call`` on the GPU, each run after an L2 flush, with the host out
    of the measurement: the runs are enqueued while the GPU sleeps, then run together."""
    torch.cuda.synchronize()
    call()  # warm-up; a configuration that cannot launch raises here
    torch.cuda.synchronize()
    flush = torch.empty(_l2_bytes() // 4, dtype=torch.int, device="cuda")
    start = time.perf_counter()
    for _ in range(3):
        flush.zero_()
        call()
    enqueue = (time.perf_counter() - start) / 3
    torch.cuda.synchronize()
    runs = max(3, min(runs, int(_BUDGET_SECONDS / max(enqueue, 1e-6))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(runs)]
    # twice the measured enqueue time, plus a millisecond, as the GPU's head start
    torch.cuda._sleep(int((2 * runs * enqueue + 1e-3) * _CYCLES_PER_SECOND))
    for begin, end in events:
        flush.zero_()
        begin.record()
        call()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(begin.elapsed_time(end) for begin, end in events)


@contextlib.contextmanager
def host_independent_kernel_timing() -> Iterator[bool]:
    """Inductor's Triton autotuning times with ``queued_kernel_ms`` inside; yields whether
    the benchmarker was swapped (False: this torch's Inductor is laid out differently)."""
    try:
        from torch._inductor.runtime import triton_heuristics
    except ImportError:
        yield False
        return
    original = getattr(triton_heuristics, "benchmarker", None)
    if original is None or not hasattr(original, "benchmark_gpu"):
        yield False
        return
    queued = _queued_benchmarker(original)
    triton_heuristics.benchmarker = queued
    try:
        yield True
    finally:
        triton_heuristics.benchmarker = original
        log.info("Triton kernel candidates timed with the host out of the measurement: %d",
                 queued.timed)


def flat_pointwise_untuned() -> contextlib.AbstractContextManager[bool]:
    """Coordinate-descent tuning skips 1-D pointwise kernels inside: they keep Inductor's
    starting block sizes. Tuned, they gained 0.2-1.0 us a model (a few hundredths of a us
    a kernel) for 12-27% of a build's tuning seconds (bench/RESULTS.md, session 67); 2-D
    pointwise kernels and reductions, which gained up to 3 and 7 us each, are still tuned.
    Yields whether the tuner was wrapped."""
    def wrap(tune: Callable) -> Callable:
        def tuned(self: Any, launcher: Any, *args: Any, **kwargs: Any) -> Any:
            return launcher if flat_pointwise(self) else tune(self, launcher, *args, **kwargs)
        return tuned
    return coordinate_descent_wrapped(wrap)


@contextlib.contextmanager
def coordinate_descent_wrapped(wrap: Callable[[Callable], Callable]) -> Iterator[bool]:
    """Inductor's coordinate-descent tuning (``CachingAutotuner.coordinate_descent_tuning``)
    replaced by ``wrap(it)`` inside; yields whether it is (False where this torch's
    Inductor is laid out differently: it tunes as it does)."""
    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except ImportError:
        yield False
        return
    tune = CachingAutotuner.__dict__.get("coordinate_descent_tuning")
    if tune is None:
        yield False
        return
    CachingAutotuner.coordinate_descent_tuning = wrap(tune)
    try:
        yield True
    finally:
        CachingAutotuner.coordinate_descent_tuning = tune


def flat_pointwise(kernel: Any) -> bool:
    """Whether the Inductor kernel ``kernel`` (a CachingAutotuner) is a pointwise kernel
    over one dimension (its size hints name only ``x``)."""
    return (getattr(kernel.heuristic_type, "name", "") == "POINTWISE"
            and len(getattr(kernel, "size_hints", None) or ()) == 1)


def _queued_benchmarker(original: Any) -> Any:
    base = type(original)

    class QueuedBenchmarker(base):  # type: ignore[misc, valid-type]
        def benchmark_gpu(self, _callable: Callable[[], Any], *args: Any, **kwargs: Any
                          ) -> float:
            if args or kwargs.get("return_mode", "min") != "min":
                return original.benchmark_gpu(_callable, *args, **kwargs)
            self.timed += 1
            return queued_kernel_ms(_callable)

    queued = QueuedBenchmarker.__new__(QueuedBenchmarker)
    queued.__dict__.update(getattr(original, "__dict__", {}))
    queued.timed = 0
    return queued


def _l2_bytes() -> int:
    size = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()),
                   "L2_cache_size", 0)
    return max(int(size), 64 * 1024 * 1024)
