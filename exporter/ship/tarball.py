"""What both bundles (exporter/ship/bundle.py, native_bundle.py) write the same way: the
SHA-256 of each member, the SHA256SUMS that lists them, and the tar itself, members
sorted with fixed times and modes, under gzip headers without a time or a file name, so
the same members give the same bytes.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path
from typing import BinaryIO, Callable

from runtime.host.outfiles import written_whole

FIXED_MTIME = 1577836800  # 2020-01-01: the same inputs give the same tar members

# A member: its bytes, or a file streamed in (artifacts, wheels, libraries: never read whole).
Members = dict[str, bytes | Path]

# Wheels and artifacts are zips whose entries are deflated already or stored on purpose
# (float weights: exporter/ship/archive_writer.py): deflate took 11 CPU s over the cpu
# bundle's 250 MB (45 MB/s) to save 2.3%, so they go in stored; scripts, texts and native
# libraries are deflated at gzip's default level.
_ZIPPED_SUFFIXES = (".whl", ".artifact")


def sha256(data: bytes | Path) -> str:
    if isinstance(data, bytes):
        return hashlib.sha256(data).hexdigest()
    with data.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def add_sums(members: Members, digests: dict[str, str]) -> None:
    """Add SHA256SUMS over every member, hashing those ``digests`` does not hold yet."""
    digests.update({m: sha256(d) for m, d in members.items() if m not in digests})
    members["SHA256SUMS"] = "".join(f"{digests[m]}  {m}\n" for m in sorted(members)).encode()


def write_tar(out: Path, folder: str, members: Members,
              executable: Callable[[str], bool]) -> None:
    """``out``, a .tar.gz of ``members`` under ``folder``/, written whole or not at all;
    a member is mode 755 where ``executable(member)`` says so, else 644."""
    with written_whole(out) as partial, partial.open("wb") as raw, \
            _GzipMembers(raw) as zipped, \
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for member, data in sorted(members.items()):
            zipped.level(0 if member.endswith(_ZIPPED_SUFFIXES) else 9)
            info = tarfile.TarInfo(f"{folder}/{member}")
            info.mtime = FIXED_MTIME
            info.mode = 0o755 if executable(member) else 0o644
            if isinstance(data, bytes):
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.size = data.stat().st_size
                with data.open("rb") as file:
                    tar.addfile(info, file)
        zipped.level(9)  # the end-of-archive blocks


class _GzipMembers:
    """The tar stream as consecutive gzip members, a new one where the compression level
    changes (RFC 1952: gzip, tar and Python read them as one stream). tarfile's "w:gz"
    would put the write time and the temporary file's name in the header."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw, self._part, self._level, self._written = raw, None, None, 0

    def level(self, level: int) -> None:
        if level != self._level:
            self.close()
            self._part = gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, mtime=0,
                                       compresslevel=level)
            self._level = level

    def write(self, data: bytes) -> int:
        if self._part is None:
            self.level(9)
        self._written += len(data)
        return self._part.write(data)

    def tell(self) -> int:  # tarfile asks where the archive starts
        return self._written

    def close(self) -> None:
        if self._part is not None:
            self._part.close()  # ends the member; the raw file stays open
            self._part = None

    def __enter__(self) -> _GzipMembers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
