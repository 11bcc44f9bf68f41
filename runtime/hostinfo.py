"""Facts about the machine that loads an artifact, and the check against what it needs.

The check runs before any compiled library is loaded: a library built for an ISA
the CPU lacks would die with SIGILL, and one built for another torch may crash in
its constructor. Both become a CompatibilityError that names both sides. The checks that
ask torch (its version, the GPU) apply only to artifacts whose partitions run on torch
(runtime/requires.py): a device without torch runs ONNX Runtime and TVM partitions.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
from pathlib import Path

from runtime.errors import CompatibilityError
from runtime.manifest import Requirements


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


def check_requirements(req: Requirements, *, where: str, torch=None) -> None:
    """Raise CompatibilityError naming both sides if this host cannot run the artifact.
    ``torch``: the module when a partition runs on it (then its version and the GPU are
    checked too), else None."""
    host_arch = platform.machine()
    if req.arch != host_arch:
        raise CompatibilityError(
            f"the artifact was built for {req.arch} but this machine is {host_arch}", where=where,
            hint=f"build it again on (or for) a {host_arch} machine")
    _check_cpu_flags(req, where)
    if torch is None:
        return
    if torch_release(req.torch) != torch_release(torch.__version__):
        raise CompatibilityError(
            f"the artifact was built with torch {req.torch} but this runtime has torch "
            f"{torch.__version__}; compiled AOTInductor code is only loadable by the same "
            "torch major.minor", where=where,
            hint=f"install torch=={req.torch.split('+')[0]} here, or rebuild with this torch")
    if req.cuda_capability is not None:
        _check_cuda(req, where, torch)


def _check_cpu_flags(req: Requirements, where: str) -> None:
    have = cpu_flags()
    if not req.cpu_flags or have is None:
        return
    missing = sorted(set(req.cpu_flags) - have)
    if missing:
        raise CompatibilityError(
            f"the artifact was compiled for the {req.cpu_isa} CPU instruction set, and this CPU "
            f"lacks {len(missing)} of the features it needs: {', '.join(missing)}", where=where,
            hint="rebuild with a lower --cpu-isa (e.g. `--cpu-isa avx2` or `--cpu-isa generic`)")


def _check_cuda(req: Requirements, where: str, torch) -> None:
    if not torch.cuda.is_available():
        raise CompatibilityError(
            f"the artifact needs a CUDA GPU of compute capability {req.cuda_capability} or newer, "
            f"and none is usable here (torch {torch.__version__}, CUDA build: "
            f"{torch.version.cuda or 'none'})", where=where,
            hint="run it on a machine with an NVIDIA GPU and a CUDA build of torch")
    major, minor = torch.cuda.get_device_capability()
    need = tuple(int(p) for p in req.cuda_capability.split("."))
    if (major, minor) < need:
        raise CompatibilityError(
            f"the artifact was built for CUDA compute capability {req.cuda_capability} and this "
            f"GPU ({torch.cuda.get_device_name()}) has {major}.{minor}", where=where,
            hint="rebuild the artifact on a machine with this GPU")
