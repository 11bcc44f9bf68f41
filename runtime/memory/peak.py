"""The memory a loaded program takes while it runs, measured, to set beside the plan.

    CPU   resident-set growth: the kernel's high-water mark (VmHWM) is reset to the
          current RSS after load (``/proc/self/clear_refs``, Linux 4.0+), the program
          runs, and the new high-water mark less that RSS is the figure. The arenas are
          allocated at load but untouched, so their pages count when first written.
    CUDA  the caching allocator's peak during the runs less what was allocated after
          load, plus the CUDA arenas (allocated at load, in use while running).

Measured in the process that runs the artifact (the validation subprocess), so
the build's own memory is not in it.
"""

from __future__ import annotations

from pathlib import Path


class PeakMemory:
    def __init__(self, program) -> None:
        self.cuda_arena = sum(arena["arena_bytes"] for device, arena in
                              program.memory_report.items() if device != "cpu")
        self.uses_cuda = any(p.device == "cuda" for p in program.manifest.partitions)
        self.record: dict = {}

    def __enter__(self) -> "PeakMemory":
        self.rss_start = _reset_high_water_mark()
        if self.uses_cuda:  # CUDA partitions need torch (runtime/program/requires.py)
            import torch
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.cuda_start = torch.cuda.memory_allocated()
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:
            return
        if self.rss_start is not None:
            self.record["cpu_peak_bytes"] = max(0, _status_bytes("VmHWM") - self.rss_start)
            self.record["cpu_how"] = "resident-set growth while running (VmHWM reset after load)"
        if self.uses_cuda:
            import torch
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - self.cuda_start + self.cuda_arena
            self.record["cuda_peak_bytes"] = peak
            self.record["cuda_how"] = ("CUDA caching allocator's peak while running, above the "
                                       "loaded program, arenas included")


def peak_resident_bytes() -> int | None:
    """This process's peak resident set since it started (VmHWM, Linux), or None.
    Not ``getrusage``'s ru_maxrss: Linux carries the parent's high-water mark into a
    child across fork and exec, so a small child of a large process reported the
    parent's size (`exporter bench`'s figure moved with the baselines it had loaded)."""
    try:
        return _status_bytes("VmHWM")
    except OSError:
        return None


def _reset_high_water_mark() -> int | None:
    """Reset VmHWM to the current RSS and return that RSS; None where Linux cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status_bytes("VmRSS")
    except OSError:
        return None


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    raise OSError(f"no {field} in /proc/self/status")
