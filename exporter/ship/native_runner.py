"""Builds the native runner (native/, C++ with CMake) for a platform and a set of backends.

    path = build_runner("linux-aarch64", frozenset({"tvm"}))   # .../edge-run, cross-compiled

The build lives in build/native/<platform>-<backends>/ and is reused until a file under
native/ (or the settings) changes: a stamp holds the hash of both. The build tree's runner
finds the wheels' libraries where they are (tests run it); ``installed_runner`` is the copy
a bundle ships: installed by CMake with the RPATH ``$ORIGIN/../lib`` and stripped. Another platform
cross-compiles with native/cmake/<gnu triple>.cmake and the wheels `make native-deps`
unpacks into build/wheels/<platform>/. A missing cmake, compiler or library is a
TargetUnavailableError (exit 2) that names `make native-deps`; our own sources failing to
compile is a BuildError.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from exporter.errors import BuildError, TargetUnavailableError, UserInputError
from runtime.host.platforms import NAMES, get_platform, host_platform, unknown_platform

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
NATIVE_DIR = ROOT / "native"
BUILD_ROOT = ROOT / "build" / "native"
WHEELS_ROOT = ROOT / "build" / "wheels"
BACKENDS = frozenset({"executorch", "tvm"})
RUNNER = "edge-run"
INSTALL_DIR = "install"  # cmake --install's prefix inside the build folder
_HINT_DEPS = "run `make native-deps` (as root: cmake, g++, minizip, libsodium, nlohmann-json " \
             "and the aarch64 cross toolchain and wheels)"
_LOG_TAIL = 25


def build_runner(platform: str | None = None, backends: frozenset[str] = frozenset(), *,
                 build_root: Path = BUILD_ROOT, jobs: int | None = None) -> Path:
    """The path of an `edge-run` built for ``platform`` (default: this machine) with the
    ``backends`` compiled in; built once, then reused until native/ changes."""
    platform = platform or host_platform()
    _check_choice(platform, backends)
    build_dir = Path(build_root) / f"{platform}-{'+'.join(sorted(backends)) or 'core'}"
    build_dir.mkdir(parents=True, exist_ok=True)
    args = _cmake_args(platform, backends)
    stamp = _fingerprint(args, backends)
    runner = build_dir / RUNNER
    # One build per folder at a time: parallel test sessions share these folders.
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp_file = build_dir / ".stamp"
        built = runner.is_file() and installed_runner(runner).is_file()
        if built and stamp_file.is_file() and stamp_file.read_text() == stamp:
            return runner
        stamp_file.unlink(missing_ok=True)
        _configure(build_dir, args)
        _compile(build_dir, jobs)
        _install(build_dir)
        stamp_file.write_text(stamp)
    log.info("built %s for %s (%s)", runner, platform, ", ".join(sorted(backends)) or "core only")
    return runner


def installed_runner(runner: Path) -> Path:
    """The bundle's copy of a runner ``build_runner`` made: bin/edge-run under the build
    folder's install prefix, its RPATH ``$ORIGIN/../lib``, stripped."""
    return runner.parent / INSTALL_DIR / "bin" / RUNNER


def _check_choice(platform: str, backends: frozenset[str]) -> None:
    problem = unknown_platform(platform)
    if problem:
        raise UserInputError(problem, hint=f"choose one of: {', '.join(NAMES)}")
    unknown = sorted(set(backends) - BACKENDS)
    if unknown:
        raise UserInputError(f"the native runtime has no backend {', '.join(unknown)}",
                             hint=f"choose among: {', '.join(sorted(BACKENDS))}")
    if not (NATIVE_DIR / "CMakeLists.txt").is_file():
        raise TargetUnavailableError("the native runtime's sources are not here",
                                     where=str(NATIVE_DIR),
                                     hint="build the runner from a source checkout")
    if shutil.which("cmake") is None:
        raise TargetUnavailableError("cmake is not installed", hint=_HINT_DEPS)


def _cmake_args(platform: str, backends: frozenset[str]) -> list[str]:
    args = ["-DCMAKE_BUILD_TYPE=Release",
            *(f"-DEDGE_WITH_{kind.upper()}={'ON' if kind in backends else 'OFF'}"
              for kind in sorted(BACKENDS))]
    if platform == host_platform():
        return args
    triple = get_platform(platform).gnu_triple
    toolchain = NATIVE_DIR / "cmake" / f"{triple}.cmake"
    if not toolchain.is_file():
        raise TargetUnavailableError(f"no toolchain file for {platform}", where=str(toolchain),
                                     hint="the native runner cross-compiles only for the "
                                          "platforms native/cmake/ has a toolchain file for")
    wheels = WHEELS_ROOT / platform
    if backends and not wheels.is_dir():
        raise TargetUnavailableError(f"the {platform} wheels of the backends are not unpacked",
                                     where=str(wheels), hint=_HINT_DEPS)
    return [*args, f"-DCMAKE_TOOLCHAIN_FILE={toolchain}",
            f"-DEXECUTORCH_ROOT={wheels / 'executorch'}", f"-DTVM_ROOT={wheels / 'tvm'}",
            f"-DTVM_FFI_ROOT={wheels / 'tvm_ffi'}"]


def _fingerprint(args: list[str], backends: frozenset[str]) -> str:
    """Hash of the settings and of every file under native/ the build reads (another
    backend's files are not read: editing them rebuilds nothing here)."""
    digest = hashlib.sha256(json.dumps(args).encode())
    for path in sorted(NATIVE_DIR.rglob("*")):
        parts = path.relative_to(NATIVE_DIR).parts
        other_backend = "backends" in parts[:2] and not path.name.startswith(tuple(backends))
        if path.is_file() and "__pycache__" not in parts and not other_backend:
            digest.update(str(path.relative_to(NATIVE_DIR)).encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _run(cmd: list[str], log_file: Path, env: dict | None = None
         ) -> subprocess.CompletedProcess:
    with open(log_file, "w") as out:
        return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False, env=env)


def _tail(log_file: Path) -> list[str]:
    lines = log_file.read_text(errors="replace").splitlines()
    return [line for line in lines[-_LOG_TAIL:] if line.strip()]


def _configure(build_dir: Path, args: list[str]) -> None:
    # A stale cache (another toolchain or root) would be reused silently: start clean.
    (build_dir / "CMakeCache.txt").unlink(missing_ok=True)
    log_file = build_dir / "configure.log"
    # not among the fingerprint's settings: it changes how long a build takes, not what
    launcher = [f"-DCMAKE_{lang}_COMPILER_LAUNCHER={shutil.which('ccache')}"
                for lang in ("C", "CXX")] if shutil.which("ccache") else []
    if _run(["cmake", "-S", str(NATIVE_DIR), "-B", str(build_dir), *args, *launcher],
            log_file).returncode:
        raise TargetUnavailableError(
            "cmake could not configure the native runtime (a compiler or library is missing)",
            where=str(log_file), details=_tail(log_file), hint=_HINT_DEPS)


def _compile(build_dir: Path, jobs: int | None) -> None:
    jobs = jobs or int(os.environ.get("EDGE_NATIVE_JOBS", "2"))
    log_file = build_dir / "build.log"
    cmd = ["cmake", "--build", str(build_dir), "--parallel", str(jobs)]
    # ccache's own cache (~/.cache/ccache) serves every backend set and every checkout, as
    # pip's does: paths under the checkout hash relative to it (a user's own setting wins)
    env = {"CCACHE_BASEDIR": str(ROOT), **os.environ}
    if _run(cmd, log_file, env).returncode:
        raise BuildError("the native runtime did not compile", where=str(log_file),
                         details=_tail(log_file),
                         hint=f"check the compiler's messages; {_HINT_DEPS} if a header "
                              "or library is missing")


def _install(build_dir: Path) -> None:
    # --strip runs the toolchain's strip (CMAKE_STRIP: aarch64-linux-gnu-strip when cross)
    log_file = build_dir / "install.log"
    shutil.rmtree(build_dir / INSTALL_DIR, ignore_errors=True)
    cmd = ["cmake", "--install", str(build_dir), "--prefix", str(build_dir / INSTALL_DIR),
           "--strip"]
    if _run(cmd, log_file).returncode:
        raise BuildError("the native runner did not install", where=str(log_file),
                         details=_tail(log_file), hint=_HINT_DEPS)


if __name__ == "__main__":  # python -m exporter.ship.native_runner [PLATFORM] [BACKEND...]
    print(build_runner(sys.argv[1] if len(sys.argv) > 1 else None, frozenset(sys.argv[2:])))
