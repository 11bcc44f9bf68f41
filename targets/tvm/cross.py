"""What target ``tvm`` needs to build for another platform (``--platform``): the LLVM
target, the cross compiler export_library links with, and what a loading CPU must have.

An aarch64 build targets the ARMv8-A baseline with NEON (Advanced SIMD, mandatory on
ARMv8-A: every Raspberry Pi 3 and later, Jetson and phone core has it), so one library
runs on all of them; ``--tvm-target`` picks another CPU (``-mcpu=cortex-a76``, say).
NEON is part of the AArch64 baseline that Linux on arm64 itself needs, so the artifact
lists no cpuinfo flag for it (qemu-user shows the host's /proc/cpuinfo, without one).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from runtime.host.platforms import get_platform, host_platform
from targets.errors import TargetOptionError


@dataclass(frozen=True)
class CrossPlatform:
    target: str  # the TVM target string (targets/tvm/compile.py's parse_target reads it)
    compiler: str  # Debian's cross g++ that links export_library's shared library
    isa: str  # the manifest's cpu_isa
    cpu_flags: tuple[str, ...]  # /proc/cpuinfo "Features" a loading CPU must list, beyond arch


CROSS: dict[str, CrossPlatform] = {
    "linux-aarch64": CrossPlatform("llvm -mtriple=aarch64-linux-gnu -mcpu=generic -mattr=+neon",
                                   "aarch64-linux-gnu-g++", "armv8-a+neon", ()),
}


def buildable() -> tuple[str, ...]:
    """This machine's platform and those it cross-compiles for."""
    return tuple(dict.fromkeys((host_platform(), *CROSS)))


def is_cross(platform: str) -> bool:
    return platform != host_platform()


def arch_of(platform: str) -> str:
    return get_platform(platform).arch


def cross_platform(platform: str) -> CrossPlatform:
    """The cross settings for ``platform``; TargetOptionError where tvm cannot build for it."""
    if platform not in CROSS:
        raise TargetOptionError(f"target 'tvm' cannot cross-compile for {platform} from "
                                f"{host_platform()}", where="--platform",
                                hint=f"platforms it builds for: {', '.join(sorted(CROSS))} "
                                     f"and this machine's ({host_platform()})")
    return CROSS[platform]


def cross_compiler(platform: str) -> str:
    """The cross g++'s path; a TargetOptionError naming how to install it if missing."""
    cross = cross_platform(platform)
    found = shutil.which(cross.compiler)
    if found is None:
        triple = get_platform(platform).gnu_triple
        raise TargetOptionError(f"building for {platform} needs the cross compiler "
                                f"{cross.compiler}, which is not installed",
                                where="--platform",
                                hint=f"`make native-deps` installs it (Debian: apt-get install "
                                     f"g++-{triple}), or build without --platform")
    return found


def check_cross_options(platform: str, *, cpu_isa: str, tune: int, tvm_target: str | None) -> None:
    """Refuse the settings that only mean something on the build host, at the start."""
    if cpu_isa != "auto":
        raise TargetOptionError(f"--cpu-isa {cpu_isa} names an x86-64 level; this build is for "
                                f"{platform}", where="--cpu-isa",
                                hint="leave --cpu-isa at auto, or pick the CPU with --tvm-target")
    if tune:
        raise TargetOptionError(f"--tune measures schedules on this machine, which cannot run "
                                f"code for {platform}", where="--tune",
                                hint="build without --tune for another platform")
    arch = get_platform(platform).arch
    if tvm_target and f"-mtriple={arch}" not in tvm_target and f'"{arch}-' not in tvm_target:
        raise TargetOptionError(f"--tvm-target '{tvm_target}' does not name the {arch} triple "
                                f"this build for {platform} needs", where="--tvm-target",
                                hint=f"add -mtriple={get_platform(platform).gnu_triple}, e.g. "
                                     f"'{cross_platform(platform).target}'")
