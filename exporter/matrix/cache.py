"""The build cache: a cell's settled outcome (and its artifact) under a key that hashes
what decides them, so an unchanged cell is never built twice.

The key covers the model's source (the spec's file bytes, every file of an ``hf:``
folder, a module spec's file, the files a model ``depends`` on), the data files the
settings name (``inputs``, ``calibration``), the resolved settings (target, its options,
dtype, recipe...), and the toolchain: the versions the manifest records
(exporter/versions.py), the target's build packages, transformers, a digest of the
exporter's own code (a source checkout keeps one version number through every change),
and the host's CPU level (``--cpu-isa auto`` compiles for it) or GPU.

A model whose source the matrix cannot find (a module spec not on the path) has no key:
it is built every run. A hit re-checks the artifact (its SHA-256, then the runtime's
archive checks of every entry) before it is trusted; one that fails is built again.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import sys
from pathlib import Path

from exporter.config.config_file import spec_location
from exporter.errors import ArtifactError
from exporter.matrix.cell import SETTLED, file_sha256
from exporter.settings import NOT_RECORDED
from exporter.matrix.spec_file import Cell
from runtime.host.outfiles import written_whole

log = logging.getLogger(__name__)
_CODE_ROOMS = ("runtime", "passes", "targets", "exporter")
_ALWAYS = ("transformers",)  # model factories use it more often than not
DURATIONS_FILE = "durations.json"  # cell id -> seconds its last build took (not part of a key)


def cell_key(cell: Cell, toolchain: dict) -> str | None:
    source = _source_digest(cell.spec)
    if source is None:
        return None
    settings = cell.settings.model_dump(mode="json", exclude=NOT_RECORDED)
    data = {name: _digest_if_file(settings.get(name)) for name in ("inputs", "calibration")}
    material = {"spec": cell.spec, "source": source, "data": data, "settings": settings,
                "depends": {d: _digest_if_file(d) for d in cell.depends},
                "toolchain": toolchain[cell.settings.target]}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def toolchain(targets: set[str]) -> dict[str, dict]:
    """Per target: what of the toolchain and the host decides its artifacts."""
    from exporter import versions
    from targets import all_targets
    from targets.cpu_isa import resolve

    common = {**versions.collect(), "code": _code_digest(), "isa": getattr(resolve("auto"),
                                                                        "name", None)}
    found = {}
    for name in targets:
        target = all_targets()[name]
        packages = [dist for dist, _ in target.packaging.build_packages] + list(_ALWAYS)
        found[name] = {**common, "packages": {p: _version(p) for p in packages},
                       "gpu": _gpu_name() if target.device == "cuda" else None}
    return found


class Cache:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def artifact(self, key: str) -> Path:
        return self.folder / f"{key}.artifact"

    def lookup(self, key: str) -> dict | None:
        """The stored record, once its artifact (if it has one) passed its checks."""
        record_file = self.folder / f"{key}.json"
        try:
            row = json.loads(record_file.read_text())
        except (OSError, ValueError):
            return None
        if row.get("artifact_sha256") and not self._intact(key, row["artifact_sha256"]):
            record_file.unlink(missing_ok=True)
            return None
        return row

    def store(self, key: str, row: dict) -> None:
        """Only settled outcomes: a crash or a timeout is run again next time."""
        if row.get("status") not in SETTLED:
            return
        with written_whole(self.folder / f"{key}.json", flag="--cache") as partial:
            partial.write_text(json.dumps(row, sort_keys=True))

    def durations(self) -> dict[str, float]:
        """Each cell's last build time in seconds (cell id -> s), whatever its outcome:
        the executor starts the longest first (see ``runner.longest_first``)."""
        try:
            found = json.loads((self.folder / DURATIONS_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return {k: float(v) for k, v in found.items() if isinstance(v, (int, float))}

    def record_durations(self, seconds: dict[str, float]) -> None:
        if not seconds:
            return
        merged = {**self.durations(), **seconds}
        with written_whole(self.folder / DURATIONS_FILE, flag="--cache") as partial:
            partial.write_text(json.dumps(merged, sort_keys=True, indent=0))

    def _intact(self, key: str, sha256: str) -> bool:
        from runtime.format.archive import ArtifactReader

        path = self.artifact(key)
        try:
            if file_sha256(path) != sha256:
                raise ArtifactError("the file's SHA-256 differs from the one recorded")
            ArtifactReader.open(path).close()  # every entry's size and SHA-256
        except (OSError, ArtifactError) as exc:
            log.warning("cache: %s failed its check (%s); building it again", path, exc)
            return False
        return True


def _source_digest(spec: str) -> str | None:
    location = spec_location(spec)
    if spec.startswith("zoo:"):
        return "zoo"  # the zoo is the exporter's own code: in the toolchain's digest
    if location is None:  # package.module:NAME
        found = _module_file(spec.rpartition(":")[0])
        return file_sha256(found) if found else None
    prefix, path, _ = location
    path = Path(path).expanduser()
    if prefix == "hf:" and path.is_dir():
        return _tree_digest(path)
    return file_sha256(path) if path.is_file() else None


def _module_file(module: str) -> Path | None:
    """The module's file, found on the path as the build will (the working directory
    first) without importing anything."""
    parts = module.split(".")
    for entry in [os.getcwd(), *sys.path]:
        base = Path(entry or ".").joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _tree_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(folder).as_posix()}\0{file_sha256(path)}\n".encode())
    return digest.hexdigest()


def _digest_if_file(value: object) -> str | None:
    if isinstance(value, str) and Path(value).expanduser().is_file():
        return file_sha256(Path(value).expanduser())
    return None


@functools.cache
def _code_digest() -> str:
    """The exporter's own source files (and the trained zoo's weights)."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for room in _CODE_ROOMS:
        for path in sorted((root / room).rglob("*")):
            if path.suffix in (".py", ".safetensors") and "__pycache__" not in path.parts:
                digest.update(f"{path.relative_to(root).as_posix()}\0".encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gpu_name() -> str | None:
    import torch
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None

