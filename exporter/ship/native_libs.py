"""The shared libraries a native runner loads, found as the device's loader would find them.

    libs = library_closure(runner, extra=[...kernel libraries...], platform="linux-aarch64")

Each object's DT_NEEDED names are resolved through its own DT_RUNPATH/DT_RPATH ($ORIGIN
expanded), then the platform's library folders (Debian's multiarch folders, the cross
toolchain's sysroot). Read with binutils' ``readelf -d``, which reads any ELF machine, so
an aarch64 runner is walked on this machine too. The C and C++ runtime (glibc, libstdc++,
libgcc_s) is the device's own and is never shipped: a library built against this
machine's would not match the device's loader.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from exporter.errors import TargetUnavailableError
from runtime.host.platforms import get_platform

# The device's C and C++ runtime: loaded from the device, never copied into a bundle.
_DEVICE_RUNTIME = re.compile(r"(ld-linux[-\w.]*|lib(c|m|dl|pthread|rt|resolv|util|stdc\+\+|"
                             r"gcc_s|mvec))\.so(\.[\d.]+)?")
_ENTRY = re.compile(r"\((NEEDED|RUNPATH|RPATH)\)\s+[^\[]*\[([^\]]*)\]")


def is_device_runtime(name: str) -> bool:
    return bool(_DEVICE_RUNTIME.fullmatch(name))


def dynamic_entries(path: Path) -> tuple[list[str], list[str]]:
    """(DT_NEEDED names, DT_RUNPATH/DT_RPATH folders with $ORIGIN expanded) of ``path``."""
    readelf = shutil.which("readelf")
    if readelf is None:
        raise TargetUnavailableError("readelf (binutils) is needed to find what the native "
                                     "runner loads", hint="apt-get install binutils")
    result = subprocess.run([readelf, "-d", "-W", str(path)], capture_output=True, text=True,
                            check=False)
    if result.returncode:
        raise TargetUnavailableError(f"readelf cannot read {path.name}",
                                     where=str(path), details=result.stderr.splitlines()[:5])
    needed, folders = [], []
    for kind, value in _ENTRY.findall(result.stdout):
        if kind == "NEEDED":
            needed.append(value)
        else:
            origin = str(path.resolve().parent)
            folders += [f.replace("$ORIGIN", origin).replace("${ORIGIN}", origin)
                        for f in value.split(":") if f]
    return needed, folders


def system_folders(platform: str) -> list[Path]:
    """Where the platform's own libraries are on this machine (host or multiarch)."""
    triple = get_platform(platform).gnu_triple
    return [Path(f"/usr/lib/{triple}"), Path(f"/lib/{triple}"), Path(f"/usr/{triple}/lib"),
            Path("/usr/local/lib")]


def library_closure(binary: Path, platform: str, extra: tuple[Path, ...] = ()
                    ) -> dict[str, Path]:
    """soname -> the file it resolves to, for every library ``binary`` and ``extra`` (libraries
    the runner opens itself) load, except the device's C and C++ runtime."""
    found: dict[str, Path] = {p.name: p.resolve() for p in extra}
    fallback = system_folders(platform)
    # Breadth first, as the loader goes: a soname an earlier object loaded satisfies later
    # ones, whose own search folders may not hold it (libtvm_runtime's libtvm_ffi).
    queue: list[Path] = [binary, *extra]
    while queue:
        path = queue.pop(0)
        needed, folders = dynamic_entries(path)
        for name in needed:
            if is_device_runtime(name) or name in found:
                continue
            found[name] = _resolve(name, [Path(f) for f in folders] + fallback, path).resolve()
            queue.append(found[name])
    return found


def _resolve(name: str, folders: list[Path], wanted_by: Path) -> Path:
    for folder in folders:
        candidate = folder / name
        if candidate.is_file():
            return candidate
    raise TargetUnavailableError(
        f"{wanted_by.name} needs {name}, which is in none of its library folders",
        where=str(wanted_by), details=[str(f) for f in folders],
        hint="run `make native-deps` (the native runner's libraries, and the arm64 ones "
             "for --platform linux-aarch64)")
