"""Zips written by hand, as a hostile artifact would be: shared by the Python reader's
tests (tests/runtime/test_archive.py) and both loaders' cases (tests/native/cases.py)."""

from __future__ import annotations

import hashlib
import struct
import warnings
import zipfile
from pathlib import Path


def record(data: bytes) -> dict:
    """A manifest's entry record for ``data``."""
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def info(name: str, mode: int | None = None) -> zipfile.ZipInfo:
    zi = zipfile.ZipInfo(name)
    zi.filename = name  # ZipInfo cuts names at NUL; hostile archives keep it
    zi.compress_type = zipfile.ZIP_DEFLATED
    if mode is not None:
        zi.external_attr = mode << 16
    return zi


def write_zip(out: Path, items, method=zipfile.ZIP_DEFLATED) -> Path:
    """items: (name or ZipInfo, data[, fixup(info)]) in order; a fixup runs after its entry
    is written, so it changes only the central directory."""
    with warnings.catch_warnings(), zipfile.ZipFile(out, "w", method) as zf:
        warnings.simplefilter("ignore")  # zipfile warns about duplicate names
        for name, data, *fixup in items:
            zf.writestr(name, data)
            for fix in fixup:
                fix(zf.infolist()[-1])
    return out


def middle_of_entry(path: Path, name: str) -> int:
    """The file offset of the middle of entry ``name``'s stored data (past its local
    header's name and extra field)."""
    with zipfile.ZipFile(path) as zf:
        zi = zf.getinfo(name)
    with open(path, "rb") as fh:
        fh.seek(zi.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", fh.read(4))
    return zi.header_offset + 30 + name_len + extra_len + zi.compress_size // 2


def flip_byte(path: Path, offset: int) -> None:
    """One bit of the byte at ``offset`` flipped in place (an open handle sees it)."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0x01]))
