"""``exporter doctor``: what this machine can build and run, and what to do where it cannot.

Each check is a row: what was looked at, ``ok`` / ``problem`` / ``absent`` (an optional
part not installed), what was found, and the fix. The probes are the ones the build
itself uses (``targets.toolchain.choose_cxx`` for the compiler, each target's
``availability``), so the doctor and the build never disagree.
"""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
from dataclasses import asdict, dataclass

import torch

OK, PROBLEM, ABSENT = "ok", "problem", "absent"


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    found: str
    fix: str = ""


def run_checks() -> list[Check]:
    return [_python(), _torch(), *_gpu(), _compiler(), _timeout(),
            *(_package(name, extra, why) for name, extra, why in _OPTIONAL), *_targets()]


def as_json(checks: list[Check]) -> dict:
    return {"checks": [asdict(c) for c in checks],
            "problems": sum(c.status == PROBLEM for c in checks)}


# (distribution, pip extra, what it is for)
_OPTIONAL = (("onnxruntime", "onnx", "target onnx"), ("onnxscript", "onnx", "target onnx"),
             ("apache-tvm", "tvm", "target tvm"), ("torchao", "quant", "--quantize on cpu/cuda"),
             ("transformers", "hf", "hf:PATH specs"),
             ("cryptography", "signing", "exporter sign, --trusted-key"),
             ("matplotlib", "", "exporter inspect --plot"))


def _python() -> Check:
    return Check("python", OK, f"{platform.python_version()} on {platform.machine()}")


def _torch() -> Check:
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
    return Check("torch", OK, f"{torch.__version__} ({build})")


def _gpu() -> list[Check]:
    if not torch.version.cuda:
        return [Check("gpu", ABSENT, "this torch has no CUDA: target cuda is off",
                      "install a CUDA build of torch on a machine with an NVIDIA GPU")]
    if not torch.cuda.is_available():
        return [Check("gpu", PROBLEM, "torch has CUDA but sees no GPU",
                      "check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES")]
    major, minor = torch.cuda.get_device_capability()
    return [Check("gpu", OK, f"{torch.cuda.get_device_name()} (compute capability "
                             f"{major}.{minor}); artifacts built here need >= {major}.{minor}")]


def _compiler() -> Check:
    from targets.toolchain import choose_cxx
    choice = choose_cxx()
    if choice.compiler is None:
        return Check("c++ compiler", PROBLEM, choice.note,
                     "install g++ or set CXX to a compiler that links libstdc++ dynamically "
                     "(e.g. CXX=/usr/bin/g++); targets cpu and cuda need it")
    if choice.switched:  # builds work (the build switches too); say how to make it explicit
        return Check("c++ compiler", OK, choice.note,
                     f"the build uses {choice.compiler} itself; set CXX={choice.compiler} to "
                     "say so")
    return Check("c++ compiler", OK, choice.note)


def _timeout() -> Check:
    if shutil.which("timeout"):
        return Check("timeout", OK, "coreutils timeout: --compile-timeout works")
    return Check("timeout", PROBLEM, "no `timeout` command: a hung compiler hangs the build",
                 "install coreutils")


def _package(name: str, extra: str, why: str) -> Check:
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        install = f"pip install '.[{extra}]'" if extra else f"pip install {name}"
        return Check(name, ABSENT, f"not installed ({why} is off)", install)
    if name == "onnxruntime":
        import onnxruntime
        version += f"; providers: {', '.join(onnxruntime.get_available_providers())}"
    return Check(name, OK, f"{version} ({why})")


def _targets() -> list[Check]:
    from targets import TARGETS
    rows = []
    for target in TARGETS.values():
        availability = target.availability()
        rows.append(Check(f"target {target.name}", OK if availability.ok else ABSENT,
                          availability.reason,
                          "" if availability.ok else "see the rows above"))
    return rows
