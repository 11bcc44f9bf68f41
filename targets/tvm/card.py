"""The tvm target's card (targets/card.py): its options, and whether apache-tvm is here,
without importing torch or tvm."""

from __future__ import annotations

import importlib.metadata

from pydantic import Field

from targets import cpu_isa
from targets.card import TargetCard, install_command, installed
from targets.options import TargetOptions


class TvmOptions(TargetOptions):
    tvm_target: str | None = Field(None, description="TVM target string (default: llvm for "
                                   "the --cpu-isa level)",
                                   examples=["llvm -mcpu=skylake-avx512"])
    tune: int = Field(0, ge=0, description="MetaSchedule trials (slow; 0 = off)")

    def measured_choices(self) -> list[str]:
        return ["--tune"] if self.tune else []


def llvm_target(isa: str) -> str:
    """This machine's LLVM target for a --cpu-isa level."""
    level = cpu_isa.resolve(isa)
    return f"llvm -mcpu={level.march}" if level is not None else "llvm"


def tvm_version() -> str:
    """From the package metadata: importing tvm to read its version was most of what
    `exporter targets` and `exporter doctor` spent."""
    try:
        return importlib.metadata.version("apache-tvm")
    except importlib.metadata.PackageNotFoundError:  # built from source: no such dist
        import tvm
        return tvm.__version__


def tvm_here() -> tuple[bool, str]:
    if not installed("tvm"):
        return False, f"apache-tvm is not installed; {install_command('tvm')}"
    return True, f"apache-tvm {tvm_version()}; default target {llvm_target('auto')}"


TVM = TargetCard("tvm", "cpu", "tvm", "Apache TVM Relax per partition (LLVM CPU code), run "
                 "by the Relax VM", TvmOptions, check=tvm_here)
