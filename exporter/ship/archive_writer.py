"""Writing the artifact file: one deterministic zip, replaced atomically (the format and
its safe reader are in runtime/format/archive.py)."""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from runtime.format.archive import (_CHUNK, _CREATE_SYSTEM_UNIX, _ZIP_MODE, _ZIP_TIME, FORMAT_NAME,
                             FORMAT_VERSION, MANIFEST_NAME, SIGNATURE_NAME, _file_dir_conflicts, _hash_stream,
                             _name_problem)
from runtime.errors import ArtifactError
from runtime.host.outfiles import written_whole


def write_artifact(dest: str | Path, manifest: dict, files: Mapping[str, bytes | Path]) -> Path:
    """Write one deterministic zip atomically; see the module docstring and docs/architecture.md."""
    dest = Path(dest)
    if not isinstance(manifest, Mapping):
        raise TypeError(f"manifest must be a mapping, not {type(manifest).__name__}")
    names = sorted(files)
    _check_writer_names(names)
    digests = {name: _hash_stream(_source_chunks(name, files[name])) for name in names}

    out = dict(manifest)  # a shallow copy: only top-level keys are replaced
    out["entries"] = {n: {"sha256": digests[n][0], "size": digests[n][1]} for n in names}
    out.setdefault("format", {"name": FORMAT_NAME, "version": FORMAT_VERSION})
    manifest_bytes = (json.dumps(out, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
    return _write_zip(dest, {**{n: (files[n], digests[n]) for n in names},
                             MANIFEST_NAME: (manifest_bytes, None)})


def write_signed(dest: Path, reader, signature: bytes) -> Path:
    """The verified artifact behind ``reader`` again, byte for byte, plus its signature
    entry (the manifest's bytes are kept exactly: they are what was signed)."""
    root = reader.extract_private()  # hashed as copied; streamed from there, not held in memory
    entries = {name: (root.joinpath(*name.split("/")), (record["sha256"], record["size"]))
               for name, record in reader.manifest["entries"].items()}
    entries[MANIFEST_NAME] = (reader.manifest_bytes, None)
    entries[SIGNATURE_NAME] = (signature, None)
    return _write_zip(dest, entries)


def _write_zip(dest: Path, entries: Mapping[str, tuple]) -> Path:
    """``entries``: name -> (bytes or path, known digest or None), written sorted, whole
    or not at all (runtime/host/outfiles.py: ``dest`` is checked, and replaced in one rename)."""
    with written_whole(dest) as partial, open(partial, "wb") as fh:
        with zipfile.ZipFile(fh, "w") as zf:
            for name in sorted(entries):
                source, digest = entries[name]
                _write_entry(zf, name, source, digest)
    return dest


def _check_writer_names(names: list[str]) -> None:
    # A bad name here is the exporter's bug, not the user's: ValueError, not ArtifactError.
    for name in names:
        if not isinstance(name, str) or name == MANIFEST_NAME:
            raise ValueError(f"bad artifact entry name {name!r}: not a str, or reserved")
        problem = _name_problem(name)
        if problem:
            raise ValueError(f"bad artifact entry name {name!r}: {problem}")
    conflicts = _file_dir_conflicts(names)
    if conflicts:
        raise ValueError(f"entry names used both as file and as directory: {conflicts}")


def _source_chunks(name: str, source: bytes | Path) -> Iterator[bytes]:
    if isinstance(source, os.PathLike):
        with open(source, "rb") as fh:  # streamed: weights may be several GB
            while chunk := fh.read(_CHUNK):
                yield chunk
    elif isinstance(source, (bytes, bytearray, memoryview)):
        yield bytes(source)
    else:
        raise TypeError(f"files[{name!r}] must be bytes or a Path, not {type(source).__name__}")


# Weights and programs that embed them are mostly float data, which deflate barely
# shrinks (ResNet-50's .onnx and .pte: 7.5%) while every load and inspect inflates them
# again (0.7 s of a 1.1 s inspect); store them.
_STORED_SUFFIXES = (".safetensors", ".pt2", ".data", ".bin", ".params", ".onnx", ".pte")


def _compression_for(name: str) -> int:
    # Fixed per name (and deflate at its default level 6), so the bytes are reproducible.
    return zipfile.ZIP_STORED if name.endswith(_STORED_SUFFIXES) else zipfile.ZIP_DEFLATED


def _write_entry(zf: zipfile.ZipFile, name: str, source, digest: tuple[str, int] | None) -> None:
    info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
    info.compress_type = _compression_for(name)
    info.external_attr = _ZIP_MODE
    info.create_system = _CREATE_SYSTEM_UNIX  # otherwise it depends on the building OS
    # Declaring the size up front makes zipfile choose zip64 the same way on every build.
    info.file_size = digest[1] if digest else len(source)
    with zf.open(info, "w") as out:
        written = _hash_stream(_source_chunks(name, source), out)
    # A Path is read twice (hash for the manifest, then copy); refuse if it changed in between.
    if digest is not None and written != digest:
        raise ArtifactError(f"input file for entry {name!r} changed while the artifact was "
                            "being written", where=str(source), hint="run the export again")
