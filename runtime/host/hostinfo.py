"""Facts about the machine that loads an artifact: its CPU's features and name, the
cores this process may use (runtime/format/consistency.py checks an artifact's needs
against them)."""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path



@functools.cache
def cpu_flags() -> frozenset[str] | None:
    """The CPU feature flags of this host, or None where the OS does not tell us."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return None
    for line in cpuinfo.read_text(errors="replace").splitlines():
        key, _, value = line.partition(":")
        # x86 says "flags", aarch64 says "Features".
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


@functools.cache
def cpu_model() -> str | None:
    """The CPU's marketing name ("AMD EPYC 7B13"), or None where the OS does not say."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return None
    for line in cpuinfo.read_text(errors="replace").splitlines():
        key, _, value = line.partition(":")
        # x86 says "model name"; some aarch64 kernels say "Model" or nothing
        if key.strip() in ("model name", "Model", "Hardware") and value.strip():
            return value.strip()
    return None


def usable_cores() -> int:
    """The cores this process may run on (a container's share, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def torch_release(version: str) -> str:
    """'2.13.0+cpu' -> '2.13': AOTInductor code is tied to torch's major.minor."""
    return ".".join(version.split("+")[0].split(".")[:2])
