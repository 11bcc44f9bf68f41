"""``exporter doctor``: what this machine can build and run, and what to do where it cannot.

Each check is a row: what was looked at, ``ok`` / ``problem`` / ``absent`` (an optional
part not installed), what was found, and the fix. The probes are the ones the build
itself uses (``targets.toolchain.choose_cxx`` for the compiler, each target's
``availability``), so the doctor and the build never disagree.
"""

from __future__ import annotations

import importlib.metadata
import platform
from dataclasses import asdict

from targets.card import ABSENT, OK, PROBLEM, Check, install_command
from targets.registry import all_targets, described

__all__ = ["ABSENT", "OK", "PROBLEM", "Check", "as_json", "run_checks"]


def run_checks() -> list[Check]:
    torch_row = _torch()
    if torch_row.status != OK:  # the rest needs torch: say what works without it
        return [_python(), torch_row, *_targets()]
    targets = list(all_targets().values())
    # targets sharing a toolchain (cpu and cuda: the C++ compiler) report it once
    own = {c.name: c for t in targets for c in t.tooling.doctor_checks()}
    needs = {t.name: t.packaging.build_packages for t in targets}
    packages = {dist: (extra, [t.name for t in targets if (dist, extra) in needs[t.name]])
                for t in targets for dist, extra in needs[t.name]}
    return [_python(), torch_row, *own.values(),
            *(_package(dist, extra, "target " + ", ".join(names) if len(names) < len(targets)
                       else "--quantize") for dist, (extra, names) in packages.items()),
            *(_package(name, extra, why) for name, extra, why in _OPTIONAL),
            *_targets()]


def as_json(checks: list[Check]) -> dict:
    return {"checks": [asdict(c) for c in checks],
            "problems": sum(c.status == PROBLEM for c in checks)}


# (distribution, pip extra, what it is for): the exporter's own optional parts
_OPTIONAL = (("transformers", "hf", "hf:PATH specs"),
             ("cryptography", "signing", "exporter sign, --trusted-key"),
             ("matplotlib", "", "exporter inspect --plot"))


def _python() -> Check:
    return Check("python", OK, f"{platform.python_version()} on {platform.machine()}")


def _torch() -> Check:
    try:
        import torch
    except ImportError as exc:
        return Check("torch", PROBLEM, f"cannot be imported ({exc}): building, validating "
                     "and benchmarking are off", "pip install 'torch>=2.11'")
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
    return Check("torch", OK, f"{torch.__version__} ({build})")


def _package(name: str, extra: str, why: str) -> Check:
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        install = install_command(extra) if extra else f"pip install {name}"
        return Check(name, ABSENT, f"not installed ({why} is off)", install)
    return Check(name, OK, f"{version} ({why})")


def _targets() -> list[Check]:
    rows = []
    for card in described().values():
        ok, reason = card.check()
        rows.append(Check(f"target {card.name}", OK if ok else ABSENT, reason,
                          "" if ok else "see the rows above"))
    return rows
