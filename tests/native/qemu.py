"""Running an aarch64 program on this machine: qemu-user with the cross toolchain's sysroot.

``qemu-aarch64 -L /usr/aarch64-linux-gnu`` finds the aarch64 loader and C++ runtime there;
the program's other libraries come from ``LD_LIBRARY_PATH`` inside the guest: a bundle's
own ``lib/`` folders first, then Debian's arm64 multiarch folder (minizip, libsodium).
Two traps of qemu-user 7.2 are avoided for every run: a guest thread pool never finishes
(the runtimes run on the calling thread: ``GUEST_ENV``), and under the default ``max`` CPU
XNNPACK's int8 kernels compute wrong results (a Cortex-A72, plain ARMv8-A, is emulated).
``missing()`` says why a test cannot run here (``make native-deps`` installs it all).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

import pytest

TRIPLE = "aarch64-linux-gnu"
SYSROOT = Path(f"/usr/{TRIPLE}")  # the cross toolchain's: ld-linux-aarch64, libstdc++
MULTIARCH = Path(f"/usr/lib/{TRIPLE}")  # the arm64 multiarch packages' libraries
QEMU = "qemu-aarch64"
CROSS_CXX = f"{TRIPLE}-g++"
CPU = "cortex-a72"  # ARMv8-A with NEON: what the cross builds target (targets/tvm/cross.py)
GUEST_ENV = {"EDGE_THREADS": "1", "TVM_NUM_THREADS": "1"}  # no thread pools in the guest
TOOLCHAIN_FILE = Path(__file__).resolve().parents[2] / "native" / "cmake" / f"{TRIPLE}.cmake"


def missing() -> str | None:
    """Why aarch64 programs cannot be built or run here, or None when they can."""
    for tool, package in ((QEMU, "qemu-user"), (CROSS_CXX, "g++-aarch64-linux-gnu"),
                          ("cmake", "cmake")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian package {package}; `make native-deps`)"
    if not (SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists():
        return f"no aarch64 sysroot at {SYSROOT} (`make native-deps`)"
    for lib, package in (("libminizip.so", "libminizip-dev:arm64"),
                         ("libsodium.so", "libsodium-dev:arm64")):
        if not (MULTIARCH / lib).exists():
            return f"no arm64 {lib} in {MULTIARCH} (Debian package {package}; `make native-deps`)"
    return None


# for a test (or a module's pytestmark) that needs the cross toolchain and qemu-user
needs_qemu = pytest.mark.skipif(missing() is not None, reason=missing() or "")


def command(program: str | Path, *args: str, lib_dirs: Sequence[str | Path] = ()) -> list[str]:
    """The command line that runs ``program`` (an aarch64 executable) under qemu-user;
    ``lib_dirs``: folders searched for its libraries before the arm64 multiarch one."""
    path = os.pathsep.join(str(Path(d).resolve()) for d in (*lib_dirs, MULTIARCH))
    env = [f"LD_LIBRARY_PATH={path}", *(f"{k}={v}" for k, v in GUEST_ENV.items())]
    return [QEMU, "-cpu", CPU, "-L", str(SYSROOT), *(w for pair in env for w in ("-E", pair)),
            str(program), *args]


def run(program: str | Path, *args: str, lib_dirs: Sequence[str | Path] = (),
        timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """Run an aarch64 program under qemu-user (text output captured unless told otherwise);
    the host's LD_LIBRARY_PATH is left out, its x86_64 libraries mean nothing there."""
    env = {k: v for k, v in (kwargs.pop("env", None) or os.environ).items()
           if k != "LD_LIBRARY_PATH"}
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    return subprocess.run(command(program, *args, lib_dirs=lib_dirs), env=env,
                          timeout=timeout, **kwargs)


def cmake_build(source: Path, build: Path, *options: str, target: str | None = None,
                timeout: float = 600) -> None:
    """Configure and build a CMake project for aarch64 with native/cmake's toolchain file."""
    configure = ["cmake", "-S", str(source), "-B", str(build),
                 f"-DCMAKE_TOOLCHAIN_FILE={TOOLCHAIN_FILE}", *options]
    subprocess.run(configure, check=True, capture_output=True, text=True, timeout=timeout)
    compile_ = ["cmake", "--build", str(build), *(["--target", target] if target else [])]
    subprocess.run(compile_, check=True, capture_output=True, text=True, timeout=timeout)
