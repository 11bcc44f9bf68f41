"""Writing the artifact file: one deterministic zip, replaced atomically (the format and
its safe reader are in runtime/format/archive.py)."""

from __future__ import annotations

import copy
import json
import os
import struct
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from runtime.format.archive import (_CREATE_SYSTEM_UNIX, _ZIP_MODE, _ZIP_TIME, FORMAT_NAME,
                                     FORMAT_VERSION, MANIFEST_NAME, SIGNATURE_NAME,
                                     _file_dir_conflicts, _name_problem)
from runtime.format.hashing import CHUNK, each, hash_stream
from runtime.errors import ArtifactError
from runtime.host.outfiles import written_whole


def write_artifact(dest: str | Path, manifest: dict, files: Mapping[str, bytes | Path]) -> Path:
    """Write one deterministic zip atomically; see the module docstring and docs/architecture.md."""
    dest = Path(dest)
    _write_zip(dest, _entries(manifest, files)[1])
    return dest


def stage_artifact(dest: str | Path, manifest: dict, files: Mapping[str, bytes | Path]
                   ) -> "Staged":
    """The bytes ``write_artifact`` writes, at a scratch path the caller has recorded and
    removes (not fsynced, not renamed: a copy to validate), kept to become the final file
    (``Staged.finish``) without reading and hashing the sources again."""
    dest, (digests, entries) = Path(dest), _entries(manifest, files)
    dest.unlink(missing_ok=True)  # a leftover of a killed process of this pid
    try:
        with open(dest, "xb") as fh:  # "x": never through a link another process put there
            infos, spans = _zip_entries(fh, entries)
            fh.flush()
            st = os.fstat(fh.fileno())
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return Staged(dest, digests, infos, spans, _identity(st))


@dataclass
class Staged:
    """A staged artifact, how its writer left each entry's info, and each entry's bytes
    in it (local header and data: where they start, how many)."""

    path: Path
    digests: dict[str, tuple[str, int]]
    infos: dict[str, zipfile.ZipInfo]
    spans: dict[str, tuple[int, int]]
    identity: tuple

    def finish(self, dest: str | Path, manifest: dict) -> Path:
        """``write_artifact(dest, manifest, files)``'s bytes, the other entries copied
        from the staged file (validated as it is): refused if it changed since staging
        (its size, times or inode; each entry's CRC, taken as it is copied)."""
        dest, names = Path(dest), sorted([*self.infos, MANIFEST_NAME])
        manifest_bytes = _manifest_bytes(manifest, self.digests)
        with written_whole(dest) as partial, open(partial, "wb") as fh, \
                open(self.path, "rb") as src:
            self._check(os.fstat(src.fileno()))
            with zipfile.ZipFile(fh, "w") as zf:
                copies = []  # (info, where in the staged file, where here, size)
                for name in names:
                    if name == MANIFEST_NAME:
                        _write_entry(zf, name, manifest_bytes, None)
                        continue
                    start, size = self.spans[name]
                    copies.append((_reserve(zf, copy.copy(self.infos[name]), size), start,
                                   zf.start_dir - size, size))
                fh.flush()
                crcs = each(lambda c: _copy_span(src.fileno(), fh.fileno(), *c), copies,
                            sum(c[3] for c in copies))
                if any(c[0].CRC != crc for c, crc in zip(copies, crcs)):
                    self._check(None)
            self._check(os.fstat(src.fileno()))
        return dest

    def _check(self, st: os.stat_result | None) -> None:
        if st is None or _identity(st) != self.identity:
            raise ArtifactError("the staged artifact changed while the artifact was being "
                                "written", where=str(self.path), hint="run the export again")


def _identity(st: os.stat_result) -> tuple:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _reserve(zf: zipfile.ZipFile, info: zipfile.ZipInfo, size: int) -> zipfile.ZipInfo:
    """Room for one entry's local header and data, copied there later, and the entry
    registered as zipfile's own write would (its central record is written from ``info``
    at close; the next entry zipfile writes goes after the room)."""
    info.header_offset = zf.start_dir
    zf.start_dir += size
    zf.filelist.append(info)
    zf.NameToInfo[info.filename] = info
    zf._didModify = True
    return info


def _copy_span(src: int, dst: int, info: zipfile.ZipInfo, src_at: int, dst_at: int,
               size: int) -> int:
    """Copy ``size`` bytes, a local header and its data; the CRC-32 of the data (inflated
    first where deflated), as zipfile recorded it, in the same pass (zlib releases the GIL)."""
    crc, data_from, done = 0, None, 0
    deflated = info.compress_type == zipfile.ZIP_DEFLATED
    inflate, room = zlib.decompressobj(-15), info.file_size + 1  # no more than it held
    while done < size:
        chunk = memoryview(os.pread(src, min(size - done, 8 * CHUNK), src_at + done))
        if not chunk:  # shorter than staged
            return info.CRC ^ 1
        if data_from is None:  # the header: 30 bytes, then the name and extra field
            name_len, extra_len = struct.unpack_from("<HH", chunk, 26)
            data_from = 30 + name_len + extra_len
        data = chunk[max(0, data_from - done):]
        try:
            data = inflate.decompress(data, room) if deflated else data
        except zlib.error:
            return info.CRC ^ 1  # not the recorded CRC: the caller refuses the staged file
        room -= len(data)
        if room <= 0:  # more than the entry held
            return info.CRC ^ 1
        crc = zlib.crc32(data, crc)
        written = 0
        while written < len(chunk):
            written += os.pwrite(dst, chunk[written:], dst_at + done + written)
        done += len(chunk)
    return crc


def _entries(manifest: dict, files: Mapping[str, bytes | Path]) -> tuple[dict, dict]:
    """Each source's (SHA-256, size), and what ``_zip_entries`` takes: the sources with
    their digests, and the manifest listing them."""
    if not isinstance(manifest, Mapping):
        raise TypeError(f"manifest must be a mapping, not {type(manifest).__name__}")
    names = sorted(files)
    _check_writer_names(names)
    hashed = each(lambda name: hash_stream(_source_chunks(name, files[name])), names,
                  sum(_source_size(source) for source in files.values()))
    digests = dict(zip(names, hashed))
    return digests, {**{n: (files[n], digests[n]) for n in names},
                     MANIFEST_NAME: (_manifest_bytes(manifest, digests), None)}


def _manifest_bytes(manifest: dict, digests: dict[str, tuple[str, int]]) -> bytes:
    out = dict(manifest)  # a shallow copy: only top-level keys are replaced
    out["entries"] = {n: {"sha256": sha, "size": size} for n, (sha, size) in digests.items()}
    out.setdefault("format", {"name": FORMAT_NAME, "version": FORMAT_VERSION})
    return (json.dumps(out, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


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
        _zip_entries(fh, entries)
    return dest


def _zip_entries(fh, entries: Mapping[str, tuple]) -> tuple[dict, dict]:
    """The zip of ``entries`` into ``fh``; each entry but the manifest: its info as
    written, and its (start, size) in ``fh``."""
    with zipfile.ZipFile(fh, "w") as zf:
        for name in sorted(entries):
            source, digest = entries[name]
            _write_entry(zf, name, source, digest)
        written = zf.infolist()  # in file order
        ends = [i.header_offset for i in written[1:]] + [zf.start_dir]
        infos = {i.filename: copy.copy(i) for i in written if i.filename != MANIFEST_NAME}
        spans = {i.filename: (i.header_offset, end - i.header_offset)
                 for i, end in zip(written, ends) if i.filename != MANIFEST_NAME}
    return infos, spans


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


def _source_size(source) -> int:
    """Bytes to hash (0 where not known yet: a missing file fails in the hashing)."""
    if isinstance(source, os.PathLike):
        try:
            return os.stat(source).st_size
        except OSError:
            return 0
    return len(source) if isinstance(source, (bytes, bytearray, memoryview)) else 0


def _source_chunks(name: str, source: bytes | Path) -> Iterator[bytes]:
    if isinstance(source, os.PathLike):
        with open(source, "rb") as fh:  # streamed: weights may be several GB
            while chunk := fh.read(CHUNK):
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
        written = hash_stream(_source_chunks(name, source), out)
    # A Path is read twice (hash for the manifest, then copy); refuse if it changed in between.
    if digest is not None and written != digest:
        raise ArtifactError(f"input file for entry {name!r} changed while the artifact was "
                            "being written", where=str(source), hint="run the export again")
