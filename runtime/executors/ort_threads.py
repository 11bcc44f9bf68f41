"""How many intra-op threads the runtime's ONNX Runtime sessions get.

ORT's default (``intra_op_num_threads = 0``) sizes the pool by the machine's physical
cores, ignoring the process's CPU mask, and pins each pool thread to one core: under
``taskset -c 0`` on a 2-core machine its worker ran pinned to core 1, outside the mask,
and a process given two cores of a large machine gets a pool as wide as the machine.
Plain ORT with an explicit count sizes nothing by the machine and pins nothing. So the
executor always gives a count: ``OMP_NUM_THREADS`` where set (what torch's intra-op pool,
the other CPU backends, reads), else the physical cores among the CPUs this process may
run on.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

_SYSFS_CPU = Path("/sys/devices/system/cpu")


def intra_op_threads(environ: dict | None = None) -> int:
    """The intra-op pool size for a session of this process (at least 1)."""
    environ = os.environ if environ is None else environ
    asked = _positive_int(environ.get("OMP_NUM_THREADS", ""))
    if asked:
        return asked
    return physical_cores(_usable_cpus())


def physical_cores(cpus: list[int], sysfs: Path = _SYSFS_CPU) -> int:
    """Distinct physical cores among logical ``cpus`` (hyperthread siblings count once,
    as in ORT's own default); their number where the topology cannot be read."""
    cores = set()
    for cpu in cpus:
        topology = sysfs / f"cpu{cpu}" / "topology"
        try:
            cores.add((topology.joinpath("physical_package_id").read_text().strip(),
                       topology.joinpath("core_id").read_text().strip()))
        except OSError:  # no sysfs (not Linux, a locked-down container): count CPUs
            return max(1, len(cpus))
    return max(1, len(cores))


def _usable_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: every CPU, as the OS reports them
        return list(range(os.cpu_count() or 1))


def _positive_int(text: str) -> int:
    # OMP_NUM_THREADS may list nesting levels ("4,2"): the first is the outer pool
    first = text.split(",")[0].strip()
    if first.isdigit() and int(first) > 0:
        return int(first)
    if text:
        log.debug("OMP_NUM_THREADS=%r is not a thread count; using the CPU mask", text)
    return 0
