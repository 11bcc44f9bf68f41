"""An exported program compiled into an AOTInductor library as the targets compile theirs,
for tests that read a library's kernels or run it: with the C++ compiler
``targets.toolchain.choose_cxx`` vetted (the GPU machine's default ``CXX`` links libstdc++
statically, and such a library segfaults on load), loaded by the C++ loader the runtime
uses (torch's Python loader first compiles CPU-ISA probes with the same compiler)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch

from targets.toolchain import choose_cxx


def compile_library(program: torch.export.ExportedProgram, path: Path) -> tuple[str, str]:
    """The package's path and its C++ sources (the kernels it loads are named there)."""
    compiler = choose_cxx().compiler
    if compiler is None:
        pytest.skip(choose_cxx().note)
    configs = {"cpp.cxx": (None, compiler)}
    with torch._inductor.config.patch(configs):
        package = torch._inductor.aoti_compile_and_package(
            program, package_path=str(path), inductor_configs=configs)
    with zipfile.ZipFile(package) as archive:
        source = "\n".join(archive.read(name).decode() for name in archive.namelist()
                           if name.endswith(".cpp"))
    return package, source


def load_library(package: str):
    """A callable over the program's flat inputs, returning its flat outputs."""
    loader = torch._C._aoti.AOTIModelPackageLoader(str(package), "model", False, 1, -1)
    return lambda *inputs: loader.run(list(inputs))
