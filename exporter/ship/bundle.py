"""``exporter package ARTIFACT... --out bundle.tar.gz``: what a device needs, in one file.

    NAME/artifacts/*.artifact   the artifacts, verified before they are packed
    NAME/wheels/*.whl           the runtime package alone (exporter/ship/wheel.py) and one
                                wheel per locked package, for this Python and the
                                bundle's platform (--platform; exporter/ship/download.py)
    NAME/requirements.lock      exact versions and the SHA-256 of those wheels: the versions
                                the artifacts were built with (numpy, each backend's library,
                                torch and safetensors only where a partition needs them:
                                runtime/program/requires.py), and everything those need, as
                                installed here (exporter/ship/lock.py)
    NAME/install.sh             checks SHA256SUMS, then a new venv with exactly those wheels
    NAME/run.sh                 checks SHA256SUMS and the artifact's pinned SHA-256, then
                                python -m runtime run artifacts/ARTIFACT --inputs ...
    NAME/README.txt, SHA256SUMS
"""

from __future__ import annotations

import platform as _platform
import re
import sys
from pathlib import Path

from packaging.version import Version

import runtime
from exporter.errors import UserInputError
from exporter.kinds import GENERATING, PLAIN, kind_name_of
from exporter.ship.download import download_wheels
from exporter.ship.lock import Lock, lock_for, lock_lines  # noqa: F401 (lock_lines: API)
from exporter.ship.scripts import install_script, run_script
from exporter.ship.tarball import Members, add_sums, sha256, write_tar
from exporter.ship.wheel import DIST_NAME, build_runtime_wheel
from exporter.versions import toolchain_version
from runtime.executors.custom_ops import KNOWN
from runtime.format.manifest import Manifest
from runtime.host import scratch
from runtime.host.outfiles import checked_output
from runtime.host.platforms import PLATFORMS, get_platform, host_platform, unknown_platform
from runtime.program.requires import loads_on
from runtime.program.requires import packages as runtime_packages


def package(artifacts: list[Path], out: Path, platform: str | None = None) -> dict:
    """Verify the artifacts, then write the bundle for ``platform`` (default: this
    machine's) whole (a temp file renamed) or not at all."""
    platform = _checked_platform(platform)
    if not artifacts:
        raise UserInputError("no artifacts to package", hint="exporter package A.artifact "
                             "[B.artifact...] --out bundle.tar.gz")
    if not out.name.endswith((".tar.gz", ".tgz")):
        raise UserInputError("the bundle must be a .tar.gz file", where=str(out))
    out = checked_output(out, reads=artifacts)
    name = out.name.removesuffix(".tar.gz").removesuffix(".tgz")
    for what, text in [("the bundle's folder name (from --out)", name),
                       *(("an artifact's file name", p.name) for p in artifacts)]:
        _check_member_name(what, text)
    manifests = _verified(artifacts)
    _check_loads_on(platform, artifacts, manifests)
    lock = lock_for([(p.name, m) for p, m in zip(artifacts, manifests)], platform)
    notes = lock.notes + custom_op_notes(artifacts, manifests)
    with scratch.directory("exporter-package-") as work:
        wheels = download_wheels(lock.pins, work / "wheels", platform)
        wheels[DIST_NAME] = build_runtime_wheel(work)
        lock.pins[DIST_NAME] = Version(toolchain_version())
        members = _members(name, artifacts, manifests, notes, lock, wheels)
        write_tar(out, name, members, executable=lambda member: member.endswith(".sh"))
    return {"bundle": str(out), "folder": name, "platform": platform,
            "artifacts": [p.name for p in artifacts],
            "wheel": wheels[DIST_NAME].name, "packages": len(lock.pins), "notes": notes,
            "lock": members["requirements.lock"].decode().splitlines()}


def _members(name: str, artifacts: list[Path], manifests: list[Manifest], notes: list[str],
             lock: Lock, wheels: dict[str, Path]) -> Members:
    """Tar member -> bytes, or a file streamed in (artifacts and wheels: hashed once)."""
    for wheel in wheels.values():
        _check_member_name("a wheel's file name", wheel.name)
    members: Members = {f"artifacts/{p.name}": p for p in artifacts}
    members.update({f"wheels/{w.name}": w for w in wheels.values()})
    digests = {member: sha256(path) for member, path in members.items()}
    lines = lock.lines({dist: [digests[f"wheels/{w.name}"]] for dist, w in wheels.items()})
    members.update(_texts(name, artifacts, manifests, notes, lines, digests, lock.platform))
    add_sums(members, digests)
    return members


def _texts(name: str, artifacts: list[Path], manifests: list[Manifest], notes: list[str],
           lines: list[str], digests: dict[str, str], platform: str) -> dict[str, bytes]:
    """The lock, the scripts (run.sh pins each artifact's SHA-256) and the README."""
    pins = {p.name: digests[f"artifacts/{p.name}"] for p in artifacts}
    arch = get_platform(platform).arch if platform in PLATFORMS else _platform.machine()
    return {"requirements.lock": "\n".join(lines).encode() + b"\n",
            "install.sh": install_script("%d.%d" % sys.version_info[:2], arch).encode(),
            "run.sh": run_script(pins).encode(),
            "README.txt": _readme(name, artifacts, manifests, notes, arch).encode()}


def _checked_platform(platform: str | None) -> str:
    """The bundle's platform: this machine's by default, else one of runtime/host/platforms.py."""
    if platform is None or platform == host_platform():
        return host_platform()
    problem = unknown_platform(platform)
    if problem:
        raise UserInputError(problem, where="--platform")
    return platform


def _check_loads_on(platform: str, artifacts: list[Path], manifests: list[Manifest]) -> None:
    """An artifact whose native code is another platform's would be refused on the device."""
    for path, manifest in zip(artifacts, manifests):
        where = loads_on(manifest)
        if platform not in where["platforms"]:
            raise UserInputError(
                f"{path.name} holds native code ({', '.join(where['native_code'])}) for "
                f"{where['platforms'][0]}, and the bundle is for {platform}", where=str(path),
                hint=f"package it with --platform {where['platforms'][0]}, or build it again "
                     f"with `exporter build --platform {platform}`")


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
    itself (runtime/executors/custom_ops.py): the device needs their code, which a bundle cannot
    know to ship (a model file's own op), so the README says so."""
    notes = []
    for path, manifest in zip(artifacts, manifests):
        ops = sorted({_printable(op.replace(".", "::", 1)) for partition in manifest.partitions
                      for op in strings(partition.meta.get("custom_ops"))} - KNOWN.keys())
        if ops:
            notes.append(f"{path.name} calls custom op(s) {', '.join(ops)}, which the runtime "
                         "does not register: copy the file that defines them onto the device "
                         "and add --preload FILE.py to run.sh's command")
    return notes


def strings(value: object) -> list[str]:
    """The strings of a manifest's list (partition meta is the artifact's word: anything)."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _readme(name: str, artifacts: list[Path], manifests: list[Manifest],
            notes: list[str], arch: str) -> str:
    rows = "\n".join(_printable(f"  {p.name}: target {m.target}, from {m.source.get('spec')}, "
                               "inputs " + ", ".join(s.describe() for s in m.signature.inputs))
                     for p, m in zip(artifacts, manifests))
    kinds = [kind_name_of(m) for m in manifests]
    plain = [p.name for p, kind in zip(artifacts, kinds) if kind == PLAIN]
    needs = sorted({dist for m in manifests for dist in runtime_packages(m)})
    torch_free = "" if "torch" in needs else " (no torch: numpy arrays in and out)"
    python = "%d.%d" % sys.version_info[:2]
    return (f"{name}: edge-exporter artifacts and what runs them\n\n{rows}\n\n"
            f"The runtime needs {', '.join(needs)} and each backend's library{torch_free};\n"
            "requirements.lock pins them, what they need and the SHA-256 of each wheel in\n"
            "wheels/, which install.sh installs offline.\n\n"
            f"On the device (Python {python}, Linux, {arch}: the wheels' own):\n"
            f"  tar xzf {name}.tar.gz && cd {name}\n"
            "  ./install.sh              # .venv with exactly the wheels in wheels/\n"
            + (f"  ./run.sh {plain[0]} --inputs in.npz --out out.npz\n" if plain else "")
            + "".join(f"  ./run.sh generate {p.name} --prompt 'Hello' -n 32\n"
                      for p, kind in zip(artifacts, kinds) if kind == GENERATING)
            + ("\nin.npz holds one array per input name.\n" if plain else "\n")
            + "install.sh and run.sh first check the files against SHA256SUMS (and run.sh\n"
            "each artifact against the SHA-256 it pins) and refuse to go on if one differs.\n"
            + "".join(_printable(f"note: {n}") + "\n" for n in notes))


def _printable(text: str) -> str:
    """Manifest text for the README and the terminal: control characters escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
