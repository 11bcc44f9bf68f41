"""Toolchain and dependency versions pinned in every manifest."""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import subprocess
import sys

TOOLCHAIN_NAME = "edge-exporter"
# of the objects `--json` prints (docs/json.md) and matrix.json holds
JSON_VERSION = 1  # bump when a documented key changes meaning or disappears


def toolchain_version() -> str:
    try:
        return importlib.metadata.version(TOOLCHAIN_NAME)
    except importlib.metadata.PackageNotFoundError:
        return "0.1.0+source"


def _package(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def compiler_version() -> str | None:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        return None
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
    return (out.splitlines() or [None])[0]


def collect() -> dict:
    import torch  # here, not at the top: the CLI reads JSON_VERSION before it needs torch
    return {
        "toolchain": f"{TOOLCHAIN_NAME} {toolchain_version()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "numpy": _package("numpy"),
        "safetensors": _package("safetensors"),
        "compiler": compiler_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
    }
