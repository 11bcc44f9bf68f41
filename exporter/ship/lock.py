"""A bundle's ``requirements.lock``: what the runtime imports for its artifacts, pinned.

The roots are the versions the artifacts were built with (their manifests), their
dependencies the versions installed here. A manifest is input like any other: pip reads
each lock line as a requirement *and its options*, so a version string carrying a newline
or ``--index-url`` would make ``install.sh`` install code from anywhere. Hence nothing a
manifest says is copied: every version is parsed as PEP 440 (``packaging.version``) and
written back from the parsed object, names are PEP 508 names, local labels come from an
allow-list, and a manifest that fails is refused with the field it came from.
"""

from __future__ import annotations

import importlib.metadata
import platform
import re
from dataclasses import dataclass, field

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from exporter.errors import UserInputError
from runtime.format.manifest import Manifest
from runtime.host.platforms import get_platform, host_platform
from runtime.program.requires import packages as runtime_packages
from targets import for_backend

# PEP 508 distribution names (the spec's own pattern)
_NAME = re.compile(r"[A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9]", re.IGNORECASE)
# What a version may be written with before it is parsed: no spaces, quotes, ';' or '#'
_VERSION_TEXT = re.compile(r"[0-9A-Za-z.+!_-]{1,64}")
# Local labels of PyTorch's own wheel variants; each is served by PyTorch's index of that name
_LOCAL = re.compile(r"cpu|cu[0-9]{2,3}|rocm[0-9]+(\.[0-9]+)*|xpu")
# PyTorch's CPU wheels, x86_64 and aarch64 alike, are +cpu builds on its cpu index; PyPI's
# plain torch is a CUDA build on both (torch 2.13.0's aarch64 wheel needs cuda-toolkit 13).
PYTORCH_INDEX = "https://download.pytorch.org/whl/"


@dataclass
class Lock:
    """Pinned distributions (canonical name -> parsed version) and notes for the README."""
    pins: dict[str, Version]
    notes: list[str] = field(default_factory=list)
    platform: str = field(default_factory=host_platform)  # where the wheels install

    def indexes(self) -> list[str]:
        """PyTorch's index for each local label the pins carry (torch 2.13.0+cpu is on
        no other index)."""
        labels = {v.local for v in self.pins.values() if v.local}
        return sorted(PYTORCH_INDEX + label for label in labels)

    def lines(self, hashes: dict[str, list[str]] | None = None) -> list[str]:
        """The lock's lines; ``hashes``: name -> sha256 digests of the files that may
        install it (pip's --require-hashes then refuses any other file)."""
        lines = [f"# exact versions for {self.platform}; resolved on Python "
                 f"{platform.python_version()} ({platform.machine()})"]
        lines += [f"--extra-index-url {url}" for url in self.indexes()]
        for name, version in sorted(self.pins.items()):
            digests = (hashes or {}).get(name, [])
            lines.append(f"{name}=={version}" + "".join(f" --hash=sha256:{d}" for d in digests))
        return lines


def checked_name(text: object, *, where: str) -> str:
    """A distribution name as pip may read it, canonical (PEP 503)."""
    if not isinstance(text, str) or not _NAME.fullmatch(text) or len(text) > 100:
        raise UserInputError(f"{_shown(text)} is not a distribution name", where=where,
                             hint="a name is letters, digits, '.', '_' and '-' (PEP 508)")
    return canonicalize_name(text)


def checked_version(text: object, *, dist: str, where: str) -> Version:
    """A PEP 440 version, parsed, with a local label only from PyTorch's variants."""
    hint = ("rebuild the artifact with `exporter build`: a lock takes plain PEP 440 "
            "versions (e.g. 1.32.0; local labels only +cpu, +cuNNN, +rocmN, +xpu)")
    if not isinstance(text, str) or not _VERSION_TEXT.fullmatch(text):
        raise UserInputError(f"the {dist} version {_shown(text)} is not a version",
                             where=where, hint=hint)
    try:
        version = Version(text)
    except InvalidVersion:
        raise UserInputError(f"the {dist} version {_shown(text)} is not a PEP 440 version",
                             where=where, hint=hint) from None
    if version.local is not None and not _LOCAL.fullmatch(version.local):
        raise UserInputError(f"the {dist} version {_shown(text)} has the local label "
                             f"'+{version.local}', which no known index serves",
                             where=where, hint=hint)
    return version


def _shown(text: object) -> str:
    """A value for an error message: repr (control characters escaped), cut short."""
    shown = repr(text)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def lock_for(artifacts: list[tuple[str, Manifest]], platform: str | None = None) -> Lock:
    """(artifact name, manifest) pairs -> the lock for ``platform`` (default: this one):
    roots at the manifests' versions, their dependencies at the versions installed here,
    as the platform's markers select them."""
    lock = Lock(pins={}, platform=platform or host_platform())
    lock.pins.update(_roots(artifacts))
    for root in list(lock.pins):
        _add_dependencies(root, lock)
    return lock


def lock_lines(manifests: list[Manifest]) -> tuple[list[str], list[str]]:
    """The lock of these manifests without hashes, and its notes (for callers and tests
    that need no wheels)."""
    lock = lock_for([(f"artifact {i}", m) for i, m in enumerate(manifests)])
    return lock.lines(), lock.notes


def _wanted(name: str, manifest: Manifest) -> list[tuple[str, object, str]]:
    """(distribution, recorded version or None, the manifest field it came from)."""
    wanted = []
    for dist in runtime_packages(manifest):
        recorded = manifest.created_by.get(dist)
        wanted.append((dist, recorded if recorded is not None else _installed(dist),
                       f"{name}: manifest.json created_by.{dist}"))
    for path, partition in _partitions(manifest):
        target = for_backend(partition.backend)
        for dist, version in (target.packaging.runtime_packages(partition) if target
                              else {}).items():
            key = next((k for k, v in partition.meta.items() if v is version), None)
            where = (f"{name}: manifest.json {path}.meta.{key}" if key else
                     f"{name}: {dist} installed here, for {path}")
            wanted.append((dist, version, where))
    return wanted


def _partitions(manifest: Manifest):
    """(the partition's path in manifest.json, the partition), entry points' included."""
    yield from ((f"partitions[{i}]", p) for i, p in enumerate(manifest.partitions))
    for entry, point in manifest.entry_points.items():
        yield from ((f"entry_points[{entry!r}].partitions[{i}]", p)
                    for i, p in enumerate(point.partitions))


def _roots(artifacts: list[tuple[str, Manifest]]) -> dict[str, Version]:
    """What the runtime imports for these artifacts, at the versions they were built with:
    no torch for artifacts that run on numpy arrays (ONNX Runtime, TVM on the CPU)."""
    found: dict[str, dict[Version, str]] = {}
    for name, manifest in artifacts:
        for dist, text, where in _wanted(name, manifest):
            dist = checked_name(dist, where=where)
            versions = found.setdefault(dist, {})
            if text is not None:
                versions.setdefault(checked_version(text, dist=dist, where=where), where)
    roots = {}
    for dist, versions in found.items():
        if len(versions) > 1:
            raise UserInputError(f"the artifacts were built with different {dist} versions "
                                 f"({', '.join(sorted(map(str, versions)))}); one environment "
                                 "cannot hold both", where="; ".join(versions.values()),
                                 hint="make one bundle per version")
        if not versions:
            raise UserInputError(f"no {dist} version is recorded in the artifacts or "
                                 "installed here", hint=f"install {dist} and try again")
        roots[dist] = next(iter(versions))
    return roots


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _add_dependencies(dist: str, lock: Lock) -> None:
    """Pin what ``dist`` needs, as installed here, recursively (markers for this host)."""
    try:
        requires = importlib.metadata.distribution(dist).requires or []
    except importlib.metadata.PackageNotFoundError:
        lock.notes.append(f"{dist} is not installed here: its own dependencies are not locked")
        return
    here = _installed(dist)
    pinned = lock.pins.get(dist)
    if here is not None and pinned is not None and pinned != Version(here):
        lock.notes.append(f"{dist} {lock.pins[dist]} is locked (the artifacts' version); its "
                          f"dependencies are those of {here}, installed here")
    for text in requires:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            lock.notes.append(f"{dist} {here} declares a requirement pip cannot read: skipped")
            continue
        if requirement.marker and not requirement.marker.evaluate(_markers(lock.platform)):
            continue
        name = checked_name(requirement.name, where=f"the installed {dist}'s requirements")
        if name in lock.pins:
            continue
        version = _installed(name)
        if version is None:
            lock.notes.append(f"{name} (needed by {dist}) is not installed here: not locked")
            continue
        lock.pins[name] = checked_version(version, dist=name,
                                          where=f"{name} {version}, installed here")
        _add_dependencies(name, lock)


def _markers(platform: str) -> dict[str, str]:
    """Environment markers of the device: this Python, the bundle's platform."""
    if platform == host_platform():
        return {"extra": ""}
    return {"extra": "", "platform_machine": get_platform(platform).arch,
            "platform_system": "Linux", "sys_platform": "linux"}
