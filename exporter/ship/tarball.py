"""What both bundles (exporter/ship/bundle.py, native_bundle.py) write the same way: the
SHA-256 of each member, the SHA256SUMS that lists them, and the tar itself, members
sorted with fixed times and modes, under a gzip header without a time or a file name, so
the same members give the same bytes.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path
from typing import Callable

from runtime.host.outfiles import written_whole

FIXED_MTIME = 1577836800  # 2020-01-01: the same inputs give the same tar members

# A member: its bytes, or a file streamed in (artifacts, wheels, libraries: never read whole).
Members = dict[str, bytes | Path]


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
    # tarfile's "w:gz" would put the write time and the temporary file's name in the header
    with written_whole(out) as partial, partial.open("wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped, \
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for member, data in sorted(members.items()):
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
