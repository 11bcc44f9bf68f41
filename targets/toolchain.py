"""The C++ compiler AOTInductor builds with, and whether its libraries load.

Some images (the GPU machine's among them) set ``CXX`` to a wrapper that links
libstdc++ statically into shared libraries. An AOTInductor library built that way
compiles fine and then segfaults on load (inside ``std::regex`` in the model
constructor, seen with torch 2.11). We probe the compiler once, by building a
tiny shared library and reading its dynamic section, and switch to a compiler
that links libstdc++ dynamically, saying so, or stop with what to set.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from runtime.host import scratch

# Throwing std::runtime_error needs libstdc++'s own symbols (not only inline
# header code), so a dynamically linking compiler must list it as NEEDED even with
# --as-needed. <stdexcept> compiles in a fraction of a second (<regex> takes far longer).
_PROBE_SOURCE = """
#include <stdexcept>
extern "C" void probe(const char* s) { throw std::runtime_error(s); }
"""
FALLBACK_COMPILERS = ("/usr/bin/g++", "/usr/bin/clang++", "g++", "clang++")


@dataclass(frozen=True)
class CxxChoice:
    compiler: str | None  # what to build with; None when nothing usable was found
    note: str  # one line for reports: what was checked and what was chosen
    switched: bool = False  # True when CXX was overridden because it links statically


def links_libstdcxx_dynamically(compiler: str) -> bool | None:
    """True/False from a real build of a shared library; None if the probe cannot run."""
    readelf = shutil.which("readelf")
    if shutil.which(compiler) is None or readelf is None:
        return None
    with scratch.directory("exporter-cxx-probe-") as tmp:
        src, lib = Path(tmp) / "probe.cpp", Path(tmp) / "probe.so"
        src.write_text(_PROBE_SOURCE)
        build = subprocess.run([compiler, "-shared", "-fPIC", "-O0", str(src), "-o", str(lib)],
                               capture_output=True, text=True, timeout=120, check=False)
        if build.returncode != 0:
            return None
        dynamic = subprocess.run([readelf, "-d", str(lib)], capture_output=True, text=True,
                                 check=False).stdout
    return "libstdc++" in dynamic


@functools.cache
def choose_cxx() -> CxxChoice:
    configured = os.environ.get("CXX") or "g++"
    if shutil.which(configured) is None:
        return _fallback(f"the C++ compiler {configured} (CXX) was not found", configured)
    verdict = links_libstdcxx_dynamically(configured)
    if verdict is not False:
        how = "links libstdc++ dynamically" if verdict else "not probed (no readelf or build)"
        return CxxChoice(shutil.which(configured) or configured, f"C++ compiler {configured}: {how}")
    return _fallback(f"CXX={configured} links libstdc++ statically into shared libraries; an "
                     "AOTInductor library built that way crashes on load", configured)


def _fallback(problem: str, configured: str) -> CxxChoice:
    """The first usual compiler that links libstdc++ dynamically, said as a switch."""
    for candidate in FALLBACK_COMPILERS:
        path = shutil.which(candidate)
        if path and path != shutil.which(configured) and links_libstdcxx_dynamically(path):
            return CxxChoice(path, f"{problem}, so {path} is used instead", switched=True)
    return CxxChoice(None, f"{problem}, and no compiler that links it dynamically was found; "
                           "install g++ or set CXX to one (e.g. CXX=/usr/bin/g++)")


TIMED_OUT = "edge-exporter: the compiler was stopped after"


def compiler_stand_in(compiler: str, seconds: int) -> str:
    """A stand-in for ``compiler`` that ``timeout`` stops after ``seconds`` (saying so on
    stderr, which Inductor's error carries, with ``TIMED_OUT``), run through ccache where
    it is installed, as the native runners' CMake builds are (``CCACHE_DISABLE=1`` turns
    it off): a rebuild of the same code skips the compile, half of a small cpu build.

    Inductor runs the compiler with no time limit; a hung compiler would hang the
    build. The stand-in is a short script at a path fixed by what it runs, so
    Inductor's cache keys stay stable across builds, named like the compiler (Inductor
    tells gcc from clang by the name). Without coreutils' ``timeout`` or ccache: the
    compiler itself."""
    timeout = shutil.which("timeout") if seconds > 0 else None
    launcher = shutil.which("ccache")
    if timeout is None and launcher is None:
        return compiler
    command = " ".join(part for part in (launcher, compiler) if part)
    if timeout:
        command = f"{timeout} --kill-after=10 {seconds} {command}"
    script = f'#!/bin/sh\n{command} "$@"\nstatus=$?\n'
    if timeout:
        script += f'[ $status -eq 124 ] && echo "{TIMED_OUT} {seconds} s" >&2\n'
    script += "exit $status\n"
    return str(_stand_in(script, Path(compiler).name))


def _stand_in(script: str, name: str) -> Path:
    import hashlib
    key = hashlib.sha256(script.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    wrapper = cache / "edge-exporter" / "cxx" / key / name
    if not wrapper.is_file() or wrapper.read_text() != script:
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        partial = wrapper.with_name(f".{wrapper.name}.{os.getpid()}")
        partial.write_text(script)
        partial.chmod(0o755)
        partial.replace(wrapper)  # atomic: concurrent builds never see half a script
    return wrapper
