"""Which CPU instruction set a CPU build targets, and what a loading CPU must have.

Inductor compiles with ``-march=native`` by default, which ties the library to
every feature of the build host and would SIGILL elsewhere. We compile for a
named x86-64 level instead, so the requirement is a known list of
``/proc/cpuinfo`` flags the runtime can check before loading.
"""

from __future__ import annotations

import functools
import platform
import re
import subprocess
from dataclasses import dataclass

from runtime.host.hostinfo import cpu_flags
from targets.errors import TargetOptionError

_X86_V2 = ("cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3")
_X86_V3 = _X86_V2 + ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
_X86_V4 = _X86_V3 + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")

# gcc -m flag -> /proc/cpuinfo flag, for the extras Inductor's vector ISA adds.
_GCC_TO_CPUINFO = {
    "avx512f": "avx512f", "avx512dq": "avx512dq", "avx512vl": "avx512vl", "avx512bw": "avx512bw",
    "avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16",
    "amx-tile": "amx_tile", "amx-bf16": "amx_bf16", "amx-int8": "amx_int8", "fma": "fma",
    "avx2": "avx2", "f16c": "f16c",
}


@dataclass(frozen=True)
class IsaLevel:
    name: str
    simdlen: int  # Inductor's config.cpp.simdlen: vector width in bits, 0 = scalar
    march: str
    flags: tuple[str, ...]


X86_LEVELS = {
    "avx512": IsaLevel("avx512", 512, "x86-64-v4", _X86_V4),
    "avx2": IsaLevel("avx2", 256, "x86-64-v3", _X86_V3),
    "generic": IsaLevel("generic", 0, "x86-64-v2", _X86_V2),
}
CHOICES = ("auto", *X86_LEVELS)


def int8_pairs_may_saturate(arch: str) -> bool:
    """Whether an int8 artifact for ``arch`` (a machine or platform name) may run where u8s8
    products saturate: on an x86 CPU without VNNI (AVX2 alone, and no x86-64 level requires
    VNNI) oneDNN's and ONNX Runtime's kernels sum pairs of products in 16 bits with
    saturation (vpmaddubsw), so one operand keeps to 7 bits there."""
    return arch.endswith(("x86_64", "AMD64"))


def resolve(requested: str) -> IsaLevel | None:
    """The level to build for; None means Inductor's own defaults (non-x86 hosts)."""
    if requested not in CHOICES:
        raise TargetOptionError(f"unknown --cpu-isa '{requested}'",
                                hint=f"choose one of: {', '.join(CHOICES)}")
    if platform.machine() not in ("x86_64", "AMD64"):
        if requested != "auto":
            raise TargetOptionError(f"--cpu-isa {requested} is for x86-64 hosts and this one is "
                                    f"{platform.machine()}", hint="use --cpu-isa auto")
        return None
    have = cpu_flags() or frozenset()
    if requested == "auto":
        return next(lvl for lvl in X86_LEVELS.values() if set(lvl.flags) <= have
                    or lvl.name == "generic")
    return X86_LEVELS[requested]


def inductor_configs(level: IsaLevel | None) -> dict:
    if level is None:
        return {}
    # Inductor picks its vector ISA from /proc/cpuinfo, then compiles and runs a probe per
    # ISA (ten compiles on a cold cache); a compiler that takes every ISA's flags makes the
    # probes say nothing new, and the build's validation runs the library anyway.
    probes = {"cpp.vec_isa_ok": True} if _compiler_takes_every_isa() else {}
    if not _inductor_takes_march():
        return {"cpp.simdlen": level.simdlen, **probes}
    return {"cpp.simdlen": level.simdlen, "cpp.march": level.march, **probes}


@functools.cache
def _compiler_takes_every_isa() -> bool:
    """GCC 12 and clang 14 know every -m flag of Inductor's x86 ISAs (AMX, AVX512-FP16)."""
    from targets.toolchain import choose_cxx

    compiler = choose_cxx().compiler
    if compiler is None:
        return False
    try:
        text = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                              timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return knows_every_isa(text.splitlines()[0] if text else "")


def knows_every_isa(version_line: str) -> bool:
    """From a compiler's first ``--version`` line: GCC 12 or later, clang 14 or later."""
    found = re.search(r"(clang|g\+\+|gcc)[^\n]*?\s(\d+)\.\d+", version_line)
    if not found:
        return False
    return int(found.group(2)) >= (14 if found.group(1) == "clang" else 12)


def required_flags(level: IsaLevel | None) -> tuple[str, tuple[str, ...]]:
    """(ISA name, cpuinfo flags) the compiled library needs, from the vector ISA Inductor picks."""
    if level is None or not _inductor_takes_march():
        # -march=native (non-x86, or a torch whose Inductor has no cpp.march setting: 2.11
        # compiles every x86 library for the build host): it needs what this host has
        return platform.machine(), tuple(sorted(cpu_flags() or ()))
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    with config.patch(inductor_configs(level)):
        isa = pick_vec_isa()
    extra = {_GCC_TO_CPUINFO[m] for m in re.findall(r"-m([\w-]+)", isa.build_arch_flags())
             if m in _GCC_TO_CPUINFO}
    name = str(isa).replace(" ", "+") if isa else level.name
    return name or level.name, tuple(sorted(set(level.flags) | extra))


def _inductor_takes_march() -> bool:
    """Whether this torch's Inductor lets us name -march (config.cpp.march); torch 2.11's
    has no such setting, and patching it raised "cpp.march does not exist" (every cpu
    build failed on the GPU machine's torch 2.11)."""
    from torch._inductor import config
    return hasattr(config.cpp, "march")
