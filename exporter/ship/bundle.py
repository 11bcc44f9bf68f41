"""``exporter package ARTIFACT... --out bundle.tar.gz``: what a device needs, in one file.

    NAME/artifacts/*.artifact   the artifacts, verified before they are packed
    NAME/wheels/edge_runtime-*.whl   the runtime package alone (exporter/ship/wheel.py)
    NAME/requirements.lock      exact versions: the ones the artifacts were built with (numpy,
                                each backend's library, and torch and safetensors only where a
                                partition needs them: runtime/requires.py), from their
                                manifests, and everything those need, as installed here
    NAME/install.sh             a new venv with the lock, then the runtime wheel (no deps)
    NAME/run.sh                 python -m runtime run artifacts/ARTIFACT --inputs ...
    NAME/README.txt, SHA256SUMS
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import platform
import re
import tarfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import runtime
from exporter.errors import UserInputError
from runtime.requires import packages as runtime_packages
from exporter.ship.wheel import build_runtime_wheel
from runtime import scratch
from runtime.custom_ops import KNOWN
from runtime.manifest import Manifest
from runtime.outfiles import checked_output, written_whole
from targets import for_backend

_FIXED_MTIME = 1577836800  # 2020-01-01: the same inputs give the same tar members


def package(artifacts: list[Path], out: Path) -> dict:
    """Verify the artifacts, then write the bundle whole (a temp file renamed) or not at all."""
    if not artifacts:
        raise UserInputError("no artifacts to package", hint="exporter package A.artifact "
                             "[B.artifact...] --out bundle.tar.gz")
    if not out.name.endswith((".tar.gz", ".tgz")):
        raise UserInputError("the bundle must be a .tar.gz file", where=str(out))
    out = checked_output(out)
    name = out.name.removesuffix(".tar.gz").removesuffix(".tgz")
    for what, text in [("the bundle's folder name (from --out)", name),
                       *(("an artifact's file name", p.name) for p in artifacts)]:
        _check_member_name(what, text)
    manifests = _verified(artifacts)
    lock, notes = lock_lines(manifests)
    notes += custom_op_notes(artifacts, manifests)
    with scratch.directory("exporter-package-") as work:
        wheel = build_runtime_wheel(work)
        # artifacts (hundreds of MB each) stay files, streamed into the tar; the rest is small
        members: dict[str, bytes | Path] = {f"artifacts/{p.name}": p for p in artifacts}
        members[f"wheels/{wheel.name}"] = wheel
        members["requirements.lock"] = "\n".join(lock).encode() + b"\n"
        members["install.sh"] = _INSTALL.encode()
        members["run.sh"] = _RUN.encode()
        members["README.txt"] = _readme(name, artifacts, manifests, notes).encode()
        members["SHA256SUMS"] = "".join(f"{_sha256(data)}  {member}\n"
                                        for member, data in sorted(members.items())).encode()
        _write_tar(out, name, members)
    return {"bundle": str(out), "folder": name, "artifacts": [p.name for p in artifacts],
            "wheel": wheel.name, "lock": lock, "notes": notes}


# Member names go into tar paths, SHA256SUMS lines and run.sh's shell text: plain names only.
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def _check_member_name(what: str, name: str) -> None:
    if not _SAFE_NAME.fullmatch(name) or len(name) > 200:
        raise UserInputError(f"{what} {name!r} is not a plain file name: the bundle uses it in "
                             "tar paths, SHA256SUMS and its shell scripts",
                             hint="use letters, digits, '.', '_', '+' and '-' (not first), "
                             "e.g. --out model-bundle.tar.gz, or rename the artifact")


def _verified(artifacts: list[Path]) -> list[Manifest]:
    names = [p.name for p in artifacts]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UserInputError(f"two artifacts share the name {repeated[0]}",
                             hint="rename one: the bundle keeps artifacts by file name")
    return [runtime.read_manifest(path) for path in artifacts]  # hashes checked, each named


def custom_op_notes(artifacts: list[Path], manifests: list[Manifest]) -> list[str]:
    """Custom ops a CPU-fallback partition calls that the runtime does not register
    itself (runtime/custom_ops.py): the device needs their code, which a bundle cannot
    know to ship (a model file's own op), so the README says so."""
    notes = []
    for path, manifest in zip(artifacts, manifests):
        ops = sorted({op.replace(".", "::", 1) for partition in manifest.partitions
                      for op in partition.meta.get("custom_ops") or ()} - KNOWN.keys())
        if ops:
            notes.append(f"{path.name} calls custom op(s) {', '.join(ops)}, which the runtime "
                         "does not register: copy the file that defines them onto the device "
                         "and add --preload FILE.py to run.sh's command")
    return notes


def lock_lines(manifests: list[Manifest]) -> tuple[list[str], list[str]]:
    """Pinned requirements: the roots at the versions the manifests record, their
    dependencies at the versions installed here. Returns (lines, notes)."""
    roots = _roots(manifests)
    notes, pins = [], dict(roots)
    for root in roots:
        _add_dependencies(root, pins, notes)
    lines = [f"# exact versions for {len(manifests)} artifact(s); built on Python "
             f"{platform.python_version()} ({platform.machine()})"]
    if "+cu" in roots.get("torch", ""):
        lines.append("--extra-index-url https://download.pytorch.org/whl/"
                     + roots["torch"].split("+")[1])
    lines += [f"{name}=={version}" for name, version in sorted(pins.items())]
    return lines, notes


def _roots(manifests: list[Manifest]) -> dict[str, str]:
    """What the runtime imports for these artifacts, at the versions they were built with:
    no torch for artifacts that run on numpy arrays (ONNX Runtime, TVM on the CPU)."""
    wanted: dict[str, set[str]] = {}
    for manifest in manifests:
        for dist in runtime_packages(manifest):
            wanted.setdefault(dist, set()).add(manifest.created_by.get(dist) or _installed(dist))
        for partition in manifest.partitions:
            target = for_backend(partition.backend)
            for dist, version in (target.runtime_packages(partition) if target else {}).items():
                wanted.setdefault(dist, set()).add(version)
    roots = {}
    for dist, versions in wanted.items():
        versions.discard(None)
        if len(versions) > 1:
            raise UserInputError(f"the artifacts were built with different {dist} versions "
                                 f"({', '.join(sorted(versions))}); one environment cannot "
                                 "hold both", hint="make one bundle per version")
        if not versions:
            raise UserInputError(f"no {dist} version is recorded in the artifacts or "
                                 "installed here", hint=f"install {dist} and try again")
        roots[dist] = versions.pop()
    return roots


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _add_dependencies(dist: str, pins: dict[str, str], notes: list[str]) -> None:
    try:
        requires = importlib.metadata.distribution(dist).requires or []
    except importlib.metadata.PackageNotFoundError:
        notes.append(f"{dist} is not installed here: its own dependencies are not locked")
        return
    if _installed(dist) != pins.get(dist, _installed(dist)):
        notes.append(f"{dist} {pins[dist]} is locked (the artifacts' version); its "
                     f"dependencies are those of {_installed(dist)}, installed here")
    for text in requires:
        requirement = Requirement(text)
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name in pins:
            continue
        version = _installed(name)
        if version is None:
            notes.append(f"{name} (needed by {dist}) is not installed here: not locked")
            continue
        pins[name] = version
        _add_dependencies(name, pins, notes)


def _sha256(data: bytes | Path) -> str:
    if isinstance(data, bytes):
        return hashlib.sha256(data).hexdigest()
    with data.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _write_tar(out: Path, folder: str, members: dict[str, bytes | Path]) -> None:
    with written_whole(out) as partial, \
            tarfile.open(partial, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for member, data in sorted(members.items()):
            info = tarfile.TarInfo(f"{folder}/{member}")
            info.mtime = _FIXED_MTIME
            info.mode = 0o755 if member.endswith(".sh") else 0o644
            if isinstance(data, bytes):
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.size = data.stat().st_size
                with data.open("rb") as file:
                    tar.addfile(info, file)


def _readme(name: str, artifacts: list[Path], manifests: list[Manifest],
            notes: list[str]) -> str:
    rows = "\n".join(f"  {p.name}: target {m.target}, from {m.source.get('spec')}, inputs "
                     + ", ".join(s.describe() for s in m.signature.inputs)
                     for p, m in zip(artifacts, manifests))
    plain = [p.name for p, m in zip(artifacts, manifests) if m.generation is None]
    needs = sorted({dist for m in manifests for dist in runtime_packages(m)})
    torch_free = "" if "torch" in needs else " (no torch: numpy arrays in and out)"
    return (f"{name}: edge-exporter artifacts and what runs them\n\n{rows}\n\n"
            f"The runtime needs {', '.join(needs)} and each backend's library{torch_free};\n"
            "requirements.lock pins them and what they need.\n\n"
            "On the device (Python 3.11+, Linux, same CPU architecture):\n"
            f"  tar xzf {name}.tar.gz && cd {name}\n"
            "  ./install.sh              # .venv with requirements.lock and the runtime wheel\n"
            + (f"  ./run.sh {plain[0]} --inputs in.npz --out out.npz\n" if plain else "")
            + "".join(f"  ./run.sh generate {p.name} --prompt 'Hello' -n 32\n"
                      for p, m in zip(artifacts, manifests) if m.generation is not None)
            + ("\nin.npz holds one array per input name." if plain else "\n")
            + " sha256sum -c SHA256SUMS checks the files.\n"
            + "".join(f"note: {n}\n" for n in notes))


_INSTALL = """#!/bin/sh
# A new virtual environment (default: .venv next to this script) with the locked
# versions, then the runtime wheel without dependencies (the lock already has them).
# pip runs from a throwaway venv and installs into the new one (pip --python), so the
# device's venv holds what runs the artifacts, not the installer (pip and setuptools,
# 25 MB); bytecode is written as modules are first imported, not for every file
# (--no-compile: 20 MB less for ONNX Runtime and numpy). To add packages later:
# .venv/bin/python -m ensurepip, then .venv/bin/python -m pip install ...
set -eu
here=$(cd "$(dirname "$0")" && pwd)
venv=${1:-$here/.venv}
python=${PYTHON:-python3}
"$python" -m venv --without-pip "$venv"
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
"$python" -m venv "$tools"
pip_install() {
    "$tools/bin/python" -m pip --python "$venv/bin/python" install --quiet \\
        --disable-pip-version-check --no-compile "$@"
}
pip_install -r "$here/requirements.lock"
pip_install --no-deps "$here"/wheels/*.whl
echo "installed into $venv; $here/run.sh --help says how to run the artifacts"
"""

_RUN = """#!/bin/sh
# Usage: run.sh ARTIFACT --inputs in.npz [--out out.npz] [--trusted-key KEY.pub]
#        run.sh generate ARTIFACT --prompt TEXT [-n N] [--json]   (--task text-generation)
# ARTIFACT: a file name in artifacts/ or a path. PYTHON overrides the venv's python.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
usage() {
    echo "usage: ./run.sh ARTIFACT --inputs in.npz [--out out.npz] [--trusted-key KEY.pub]"
    echo "       ./run.sh generate ARTIFACT --prompt TEXT [-n N] [--json]"
    echo "artifacts in this bundle:"; ls "$here/artifacts"
}
if [ $# -eq 0 ]; then usage >&2; exit 2; fi
case "$1" in -h|--help) usage; exit 0 ;; esac
command=run
if [ "$1" = generate ]; then
    command=generate; shift
    if [ $# -eq 0 ]; then usage >&2; exit 2; fi
fi
artifact=$1; shift
[ -f "$artifact" ] || artifact=$here/artifacts/$artifact
exec "${PYTHON:-$here/.venv/bin/python}" -m runtime "$command" "$artifact" "$@"
"""
