"""Coordinate-descent tuning's candidates compiled ahead, in Inductor's compile workers.

Inductor's coordinate-descent tuning (targets/aoti/cuda.py) compiles each candidate block
size in the build's own process, one after another: about seven a kernel at a quarter of a
second each on a busy machine, 35-50% of a cuda build's lowering (bench/RESULTS.md,
session 67). Inside ``warmed_neighbours()``, before a kernel is tuned, the candidates of
the tuner's first sweep (each tunable field one step up and one down from the starting
block sizes) go to Inductor's compile workers, which compile them into Triton's on-disk
cache; the tuner's own compiles of them then load from it. The search, its timings and
its choice stay Inductor's: only where the compiles run moves. Without a running worker
pool, or where this torch lays Inductor out differently, nothing is warmed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import inspect
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from targets.aoti.kernel_timing import coordinate_descent_wrapped

log = logging.getLogger(__name__)
# A candidate, not yet the default: bench/cuda_gap.py turns it on for a variant.
WARM = False
# for one kernel's candidates; past it the tuner compiles what is left, and no later
# kernel of this process is warmed (a stalled pool costs one wait, not one a kernel)
_WAIT_S = 30
_UNTUNED = ("TEMPLATE", "USER_AUTOTUNE", "FIXED")  # kinds Inductor's tuner returns at once
_CACHE_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
warmed = {"kernels": 0, "candidates": 0, "stalled": 0}  # in this process, for a log


def warmed_neighbours() -> contextlib.AbstractContextManager[bool]:
    """Inductor's coordinate-descent tuning with its first sweep compiled ahead in the
    compile workers (while ``WARM``); yields whether it is."""
    def wrap(tune: Callable) -> Callable:
        def tuned(self: Any, launcher: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                warm(self, launcher.config)
            except Exception:  # noqa: BLE001 - a head start only: the tuner compiles the rest
                log.debug("candidates not compiled ahead", exc_info=True)
            return tune(self, launcher, *args, **kwargs)
        return tuned
    return coordinate_descent_wrapped(wrap, on=WARM)


def warm(kernel: Any, config: Any) -> int:
    """Compile the first sweep's candidates from ``config`` of the Inductor kernel
    ``kernel`` (a CachingAutotuner) in the compile workers and wait for them; how many."""
    from torch._inductor.async_compile import AsyncCompile
    if getattr(kernel.heuristic_type, "name", "") in _UNTUNED:
        return 0
    if warmed["stalled"] or not AsyncCompile.use_process_pool():
        return 0
    if kernel.fn.fn is None:  # compiled in a worker: what the tuner itself loads first
        kernel.fn = kernel._reload_kernel().fn
    function = kernel.fn.fn
    source = Path(inspect.getsourcefile(function)).read_text()
    env = {name: os.environ[name] for name in _CACHE_ENV if name in os.environ}
    pool = AsyncCompile.process_pool()
    jobs = [pool.submit(compile_config, function.__name__, source, candidate, env)
            for candidate in first_sweep(kernel.coordesc_tuner, config)]
    done, late = concurrent.futures.wait(jobs, timeout=_WAIT_S)
    warmed["stalled"] += bool(late)
    warmed["kernels"] += 1
    warmed["candidates"] += sum(1 for job in done if job.exception() is None)
    return len(jobs)


def first_sweep(tuner: Any, config: Any) -> list:
    """The configs Inductor's CoordescTuner tries first from ``config``: each tunable
    field one step up and one down, where valid."""
    from torch._inductor.runtime.coordinate_descent_tuner import get_field, set_field
    found = []
    for name in tuner.tunable_fields:
        value = get_field(config, name)
        if value is None:
            continue
        for other in tuner.get_neighbour_values(name, value):
            candidate = copy.deepcopy(config)
            set_field(candidate, name, other)
            if tuner.is_valid_config(candidate):
                found.append(candidate)
    return found


def compile_config(name: str, source: str, config: Any, env: dict) -> None:
    """In a compile worker: the kernel ``name`` of the generated ``source`` compiled at
    ``config`` into Triton's cache, as Inductor's own worker compiles a kernel."""
    from torch._inductor.codecache import _load_triton_kernel_from_source
    with contextlib.suppress(ImportError):
        from torch._inductor.runtime.compile_tasks import _set_triton_ptxas_path
        _set_triton_ptxas_path()
    os.environ.update(env)
    # a copy: the worker's loaded module (and the kernel in it) is shared with its other
    # jobs, Inductor's own among them
    kernel = copy.copy(_load_triton_kernel_from_source(name, source))
    kernel._precompile_config(config)
