"""The platforms an artifact can be built for, named once for the build and the loader.

A platform is an OS and a CPU architecture ("linux-aarch64"). The build records the one it
built for (``exporter build --platform``); the loader compares it with this machine's only
where the artifact holds native code (runtime/format/consistency.py), since ONNX and
``.pte`` programs run wherever their runtime does.
"""

from __future__ import annotations

import difflib
import platform as _platform
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Platform:
    name: str  # "linux-aarch64": the --platform value and the manifest's record
    arch: str  # platform.machine() there: "aarch64"
    gnu_triple: str  # Debian's cross toolchain prefix and multiarch folder
    glibc: int  # the device's glibc is 2.<glibc> or newer: its manylinux wheels install

    def wheel_tags(self) -> list[str]:
        """The wheel platform tags a device of this platform installs, newest first:
        manylinux_2_<glibc> down to manylinux2014 (pip does not expand them itself)."""
        return [f"manylinux_2_{minor}_{self.arch}" for minor in range(self.glibc, 16, -1)] + [
            f"manylinux2014_{self.arch}"]


PLATFORMS: dict[str, Platform] = {p.name: p for p in (
    Platform("linux-x86_64", "x86_64", "x86_64-linux-gnu", glibc=28),
    Platform("linux-aarch64", "aarch64", "aarch64-linux-gnu", glibc=28),
)}
NAMES: tuple[str, ...] = tuple(PLATFORMS)

# what platform.machine() says elsewhere for the same architecture (macOS, Windows)
_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}


def normal_arch(machine: str) -> str:
    return _ARCH_ALIASES.get(machine.lower(), machine)


def platform_name(arch: str, os_name: str = "linux") -> str:
    """'x86_64' -> 'linux-x86_64' (also for architectures not in PLATFORMS)."""
    return f"{os_name}-{normal_arch(arch)}"


def host_platform() -> str:
    """This machine's platform name, whether or not builds can target it."""
    os_name = "linux" if sys.platform.startswith("linux") else sys.platform
    return platform_name(_platform.machine(), os_name)


def unknown_platform(name: str) -> str | None:
    """Why ``name`` is not a platform (with a did-you-mean), or None when it is one."""
    if name in PLATFORMS:
        return None
    guess = difflib.get_close_matches(name, NAMES, n=1, cutoff=0.5)
    near = f" (did you mean {guess[0]}?)" if guess else ""
    return f"unknown platform '{name}'{near}; the platforms are: {', '.join(NAMES)}"


def get_platform(name: str) -> Platform:
    """The platform called ``name``; ValueError saying which exist otherwise."""
    problem = unknown_platform(name)
    if problem:
        raise ValueError(problem)
    return PLATFORMS[name]
