"""The artifact file: one deterministic zip with a manifest, read only after it is verified.

The writer (exporter/ship/archive_writer.py, on the build side) produces the same bytes
for the same inputs (sorted entries, fixed timestamps, permissions and compression level)
and replaces the destination atomically. The reader treats
the file as hostile: it checks sizes, entry names, the manifest and every entry's SHA-256 before
anything else parses or loads a byte of it, and it never calls ``extractall``. Code such as a
compiled ``.so`` is only loaded from a private copy that was re-hashed while it was written.
"""

from __future__ import annotations

import os
import stat
import struct
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from runtime.errors import ArtifactError
from runtime.host import scratch
from runtime.format.hashing import CHUNK, each, hash_stream
from runtime.format.limits import Limits, over_limit  # noqa: F401 (Limits re-exported)
from runtime.format.manifest_json import FORMAT_NAME, FORMAT_VERSION, parse_manifest  # noqa: F401 (re-exported)

MANIFEST_NAME = "manifest.json"
# The Ed25519 signature over manifest.json's bytes (runtime/format/signing.py). Like the manifest
# it is not in the manifest's entry list: the manifest cannot name its own signature.
SIGNATURE_NAME = "manifest.sig"
MAX_SIGNATURE_BYTES = 4096

_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_ZIP_MODE = (stat.S_IFREG | 0o644) << 16
_CREATE_SYSTEM_UNIX = 3
_RATIO_MIN_BYTES = 1 << 20  # small entries may compress very well without being bombs
# A central directory record is 46 bytes plus name, extra field and comment. Our writer emits
# short names and no comments, so 4 KiB per record bounds what zipfile reads and parses into
# memory before we can count the entries.
_MAX_DIR_BYTES_PER_ENTRY = 4096
# What a corrupt or hostile zip can make zipfile/zlib raise while we read it.
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError,
               ValueError, NotImplementedError, struct.error)

_HINT_REBUILD = "do not use this file; rebuild the artifact with the exporter"
_HINT_MODIFIED = ("the file was modified or corrupted after it was built; copy it again "
                  "from its source or rebuild the artifact")


def _name_problem(name: str) -> str | None:
    """Why `name` is not a safe entry name, or None. Shared by the writer and the reader."""
    if not name:
        return "empty name"
    if any(ord(c) < 0x20 or c == "\x7f" for c in name):
        return "contains a NUL or control character"
    if "\\" in name:
        return "contains a backslash"
    if name.startswith("/"):
        return "is an absolute path"
    if ":" in name:  # drive letters ("C:x") and NTFS alternate data streams ("a:b")
        return "contains ':' (drive letter or stream name)"
    for part in name.split("/"):
        if part in ("", ".", ".."):
            return f"has an empty, '.' or '..' path component ({part!r})"
        if len(part.encode("utf-8", "surrogatepass")) > 255:
            return "has a path component longer than 255 bytes"
    return None


def _file_dir_conflicts(names: Iterable[str]) -> list[str]:
    """Names that another name also uses as a directory ('a' and 'a/b'): not extractable."""
    names = set(names)
    dirs: set[str] = set()
    for name in names:
        parts = name.split("/")
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return sorted(names & dirs)


def _where(path: Path, entry: str | None = None) -> str:
    return f"{path}" if entry is None else f"{path}, entry {entry!r}"


# ---------------------------------------------------------------------------- reader

class ArtifactReader:
    """Verified, read-only view of an artifact; build it with ``ArtifactReader.open``."""

    def __init__(self, path: Path, fh: BinaryIO, zf: zipfile.ZipFile, manifest: dict,
                 infos: dict[str, zipfile.ZipInfo]) -> None:
        self.path = path
        self.manifest = manifest
        self._fh = fh  # kept open: later reads see the same inode that was verified
        self._zf = zf
        self._infos = infos
        self._private_dirs: list[Path] = []

    @classmethod
    def open(cls, path: str | Path, limits: Limits = Limits()) -> "ArtifactReader":
        path = Path(path)
        fh = _open_regular_file(path, limits)
        try:
            zf = _open_zip(path, fh, limits)
            infos = _check_structure(path, fh, zf, limits)
            manifest, manifest_bytes = _load_manifest(path, zf, infos, limits)
            _check_entry_set(path, manifest, infos)
            entries = manifest["entries"]
            each(lambda name: _verify_entry(path, zf, infos[name], entries[name]),
                 sorted(entries), sum(infos[name].file_size for name in entries))
        except BaseException:
            fh.close()
            raise
        reader = cls(path, fh, zf, manifest, infos)
        reader.manifest_bytes = manifest_bytes  # what a signature covers: the bytes parsed
        return reader

    def __enter__(self) -> "ArtifactReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def names(self) -> list[str]:
        return sorted(self.manifest["entries"])

    def signature_bytes(self) -> bytes | None:
        """The signature entry (not hashed by the manifest: it signs it), or None."""
        name, limit = SIGNATURE_NAME, MAX_SIGNATURE_BYTES
        if name not in self._infos:
            return None
        data = b"".join(_entry_chunks(self.path, self._zf, self._infos[name], limit + 1))
        if len(data) > limit:
            raise ArtifactError(f"entry is over {limit} bytes", where=_where(self.path, name),
                                hint=_HINT_REBUILD)
        return data

    def read_bytes(self, name: str) -> bytes:
        info, expected = self._lookup(name)
        # Re-hash: the file may have been changed in place since open. Sizes were bounded at
        # open, and the read stops one byte past the expected size.
        data = b"".join(_entry_chunks(self.path, self._zf, info, expected["size"] + 1))
        _compare(self.path, name, hash_stream([data]), expected)
        return data

    def stream_into(self, name: str, sink: BinaryIO) -> None:
        """Write entry ``name`` into ``sink`` chunk by chunk, re-hashing what is written:
        an entry changed since open (TOCTOU) is refused after its last chunk, and the
        caller discards what the sink holds."""
        info, expected = self._lookup(name)
        chunks = _entry_chunks(self.path, self._zf, info, expected["size"] + 1)
        _compare(self.path, name, hash_stream(chunks, sink), expected)

    def extract_private(self, names: Iterable[str] | None = None) -> Path:
        """Copy entries into a fresh 0o700 directory, re-hashing what is written; return it."""
        wanted = self.names() if names is None else sorted(set(names))
        sizes = [self._lookup(name)[1]["size"] for name in wanted]
        # 0o700, recorded: a later build removes it if this process is killed.
        root = scratch.make_dir("edge-artifact-").resolve()
        self._private_dirs.append(root)
        try:
            each(lambda name: self._copy_entry(root, name), wanted, sum(sizes))
        except BaseException:
            scratch.remove(root)
            self._private_dirs.remove(root)
            raise
        return root

    def close(self) -> None:
        for directory in self._private_dirs:
            scratch.remove(directory)
        self._private_dirs.clear()
        self._zf.close()
        self._fh.close()

    def _lookup(self, name: str) -> tuple[zipfile.ZipInfo, dict]:
        expected = self.manifest["entries"].get(name)
        if expected is None:
            raise ArtifactError("entry not found in the artifact", where=_where(self.path, name),
                                hint="check the entry name, or rebuild the artifact")
        return self._infos[name], expected

    def _copy_entry(self, root: Path, name: str) -> None:
        target = root.joinpath(*name.split("/"))
        # Names were validated at open; this is a second, independent guard against escapes.
        if root not in target.resolve().parents:
            raise ArtifactError("entry would be written outside the private directory",
                                where=_where(self.path, name), hint=_HINT_REBUILD)
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        with os.fdopen(os.open(target, flags, 0o600), "wb") as dst:
            # not fsynced: the copy is read back through the page cache and removed at close
            self.stream_into(name, dst)


# ---------------------------------------------------------------------------- open-time checks

def _open_regular_file(path: Path, limits: Limits) -> BinaryIO:
    """Check 1: an existing regular file within the size limit, opened once and kept open."""
    try:
        # O_NONBLOCK: opening a FIFO must not hang before fstat can refuse it.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ArtifactError("artifact file not found", where=str(path),
                            hint="check the path, or build the artifact first") from None
    except OSError as exc:
        raise ArtifactError(f"cannot open the artifact file ({exc.strerror})", where=str(path),
                            hint="check the path and its permissions") from None
    st = os.fstat(fd)
    problem = hint = None
    if not stat.S_ISREG(st.st_mode):
        problem, hint = "not a regular file", "pass the path of the artifact file itself"
    elif st.st_size > limits.max_archive_bytes:
        problem, hint = over_limit("the artifact", st.st_size, "max_archive_bytes",
                                   limits.max_archive_bytes, also=("max_entry_bytes",))
    if problem:
        os.close(fd)
        raise ArtifactError(problem, where=str(path), hint=hint)
    return os.fdopen(fd, "rb")


def _open_zip(path: Path, fh: BinaryIO, limits: Limits) -> zipfile.ZipFile:
    """Check 2, with the entry count bounded before zipfile builds one object per entry."""
    not_zip = ArtifactError("not a valid artifact (truncated or not a zip)", where=str(path),
                            hint=_HINT_MODIFIED)
    try:
        # zipfile's own (private) end-record parser, so we bound exactly what it will read.
        end = zipfile._EndRecData(fh)
        if not end:
            raise not_zip
        count, dir_size = end[zipfile._ECD_ENTRIES_TOTAL], end[zipfile._ECD_SIZE]
    except AttributeError:  # helper gone in a future Python: the checks after parsing remain
        count, dir_size = 0, 0
    except _ZIP_ERRORS:
        raise not_zip from None
    if count > limits.max_entries or dir_size > limits.max_entries * _MAX_DIR_BYTES_PER_ENTRY:
        raise ArtifactError(f"artifact declares {count} entries in a {dir_size}-byte directory, "
                            f"over the limit of {limits.max_entries}", where=str(path),
                            hint=_HINT_REBUILD)
    try:
        return zipfile.ZipFile(fh)
    except _ZIP_ERRORS:
        raise not_zip from None


def _check_structure(path: Path, fh: BinaryIO, zf: zipfile.ZipFile,
                     limits: Limits) -> dict[str, zipfile.ZipInfo]:
    """Checks 3 and 4: entry count, kinds, sizes, ratios, then names. Returns name -> info."""
    infos = zf.infolist()
    if len(infos) > limits.max_entries:
        raise ArtifactError(f"artifact has {len(infos)} entries, over the limit of "
                            f"{limits.max_entries}", where=str(path), hint=_HINT_REBUILD)
    by_name: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        name = info.orig_filename  # zipfile's .filename silently cuts names at a NUL byte
        if name in by_name or info.filename in by_name:
            raise ArtifactError("duplicate entry name", where=_where(path, name),
                                hint=_HINT_REBUILD)
        _check_entry_kind(path, name, info, limits)
        by_name[name] = info
    for name in by_name:
        problem = _name_problem(name)
        if problem:
            raise ArtifactError(f"unsafe entry name: {problem}", where=_where(path, name),
                                hint=_HINT_REBUILD)
    for name in _file_dir_conflicts(by_name):
        raise ArtifactError("entry name is used both as a file and as a directory",
                            where=_where(path, name), hint=_HINT_REBUILD)
    # Overlapping entries let a small file expand many times over (a "zip quine" bomb).
    if sum(i.compress_size for i in infos) > os.fstat(fh.fileno()).st_size:
        raise ArtifactError("entries overlap or claim more data than the file holds",
                            where=str(path), hint=_HINT_REBUILD)
    _check_totals(path, infos, limits)
    return by_name


def _check_totals(path: Path, infos: list[zipfile.ZipInfo], limits: Limits) -> None:
    """The whole archive's inflated size, and its ratio once past 1 MiB: entries that are
    each small enough to be exempt from the per-entry ratio are not exempt together."""
    total = sum(i.file_size for i in infos)
    packed = max(sum(i.compress_size for i in infos), 1)
    if total > limits.max_total_bytes:
        problem, hint = over_limit("all entries together", total, "max_total_bytes",
                                   limits.max_total_bytes)
        raise ArtifactError(problem, where=str(path), hint=hint)
    if total >= _RATIO_MIN_BYTES and total > limits.max_compression_ratio * packed:
        raise ArtifactError(f"the entries expand {packed} bytes to {total} (ratio over "
                            f"{limits.max_compression_ratio:g}; a zip bomb?)", where=str(path),
                            hint=_HINT_REBUILD)


def _check_entry_kind(path: Path, name: str, info: zipfile.ZipInfo, limits: Limits) -> None:
    mode = info.external_attr >> 16
    ftype = stat.S_IFMT(mode)
    problem, hint = None, _HINT_REBUILD
    if not info.filename:  # zipfile's is_dir() below would index an empty name
        problem = "entry has an empty name"
    elif info.flag_bits & 0x41:  # bit 0: encrypted, bit 6: strong encryption
        problem = "entry is encrypted"
    elif ftype == stat.S_IFLNK:
        problem = "entry is a symbolic link"
    elif info.is_dir() or ftype == stat.S_IFDIR:
        problem = "entry is a directory"
    elif ftype not in (0, stat.S_IFREG):  # 0: written by a tool that stores no Unix mode
        problem = f"entry is not a regular file (mode {oct(mode)})"
    elif info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        problem = f"entry uses unsupported compression method {info.compress_type}"
    elif info.file_size > limits.max_entry_bytes:
        problem, hint = over_limit("the entry", info.file_size, "max_entry_bytes",
                                   limits.max_entry_bytes)
    elif (info.file_size >= _RATIO_MIN_BYTES
          and info.file_size > limits.max_compression_ratio * max(info.compress_size, 1)):
        problem = (f"entry expands {info.compress_size} bytes to {info.file_size} (ratio over "
                   f"{limits.max_compression_ratio:g}; a zip bomb?)")
    if problem:
        raise ArtifactError(problem, where=_where(path, name), hint=hint)


def _load_manifest(path: Path, zf: zipfile.ZipFile, infos: dict[str, zipfile.ZipInfo],
                   limits: Limits) -> tuple[dict, bytes]:
    """Check 5: manifest.json is a bounded UTF-8 JSON object of a format version we read."""
    def bad(what: str) -> ArtifactError:
        return ArtifactError(what, where=_where(path, MANIFEST_NAME), hint=_HINT_REBUILD)

    info = infos.get(MANIFEST_NAME)
    if info is None:
        raise bad("artifact has no manifest.json (not an artifact, or built by another tool)")
    if info.file_size > limits.max_manifest_bytes:
        raise bad(f"manifest is {info.file_size} bytes, over the "
                  f"{limits.max_manifest_bytes}-byte limit")
    raw = b"".join(_entry_chunks(path, zf, info, limits.max_manifest_bytes + 1))
    return parse_manifest(raw, bad, where=_where(path, MANIFEST_NAME)), raw


def _check_entry_set(path: Path, manifest: dict, infos: dict[str, zipfile.ZipInfo]) -> None:
    """Check 6: the manifest lists exactly the archive's entries, other than itself."""
    listed, present = set(manifest["entries"]), set(infos) - {MANIFEST_NAME, SIGNATURE_NAME}
    details = [f"listed in the manifest but missing from the archive: {n!r}"
               for n in sorted(listed - present)]
    details += [f"in the archive but not listed in the manifest: {n!r}"
                for n in sorted(present - listed)]
    if details:
        raise ArtifactError("the manifest and the archive disagree on the entries",
                            where=str(path), details=details, hint=_HINT_MODIFIED)


def _verify_entry(path: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo,
                  expected: dict) -> None:
    """Check 7: size (declared, then actual) and SHA-256 of one entry, streamed."""
    if info.file_size != expected["size"]:
        _compare(path, info.orig_filename, (None, info.file_size), expected)
    got = hash_stream(_entry_chunks(path, zf, info, expected["size"] + 1))
    _compare(path, info.orig_filename, got, expected)


def _entry_chunks(path: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo,
                  limit: int) -> Iterator[bytes]:
    """At most `limit` bytes of an entry; zip-level corruption becomes ArtifactError.

    Callers pass one byte more than they expect, so an overlong entry shows and the read
    reaches the end of the entry, where zipfile checks its CRC."""
    try:
        with zf.open(info) as src:
            while limit > 0 and (chunk := src.read(min(CHUNK, limit))):
                limit -= len(chunk)
                yield chunk
    except _ZIP_ERRORS as exc:
        raise ArtifactError(f"entry data is corrupt ({type(exc).__name__}: {exc})",
                            where=_where(path, info.orig_filename), hint=_HINT_MODIFIED) from exc


def _compare(path: Path, name: str, got: tuple[str | None, int], expected: dict) -> None:
    sha, size = got
    if size != expected["size"]:
        what = f"entry size {size} does not match the manifest ({expected['size']})"
    elif sha != expected["sha256"]:
        what = "entry SHA-256 does not match the manifest"
    else:
        return
    raise ArtifactError(what, where=_where(path, name), hint=_HINT_MODIFIED)
