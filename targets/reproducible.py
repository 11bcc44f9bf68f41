"""Same spec, same bytes: AOTInductor's ``.pt2`` made reproducible.

Two things in the package differ between builds of one program, though the compiled
library does not:

* the generated C++ sources it carries (for debugging) end with the compile and link
  commands only when this process compiled them, not when Inductor's cache had them,
  and those commands name a temporary directory; ``normalize_package`` cuts them off
  and writes the records again, sorted, with torch's own PT2 writer (which aligns
  records for mmap, as the loader expects);
* torch's zip writer stores a random ``.data/serialization_id`` (torch uses it only to
  tell loaded files apart); ``pin_serialization_id`` rewrites it in place to digits
  derived from the other records, fixing the CRC-32s, so nothing else moves.

Written here: torch has no option for either.
"""

from __future__ import annotations

import hashlib
import struct
import zipfile
import zlib
from pathlib import Path

SERIALIZATION_ID = ".data/serialization_id"
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # signature ... name length, extra length
_CENTRAL_HEADER = struct.Struct("<4s6H3L5H2L")


_COMMANDS = b"\n// Compile cmd\n"
# records the PT2 writer adds itself when it closes
_WRITTEN_BY_WRITER = (".data/version", SERIALIZATION_ID)


def normalize_package(package: Path) -> None:
    from torch.export.pt2_archive._package import PT2ArchiveWriter

    with zipfile.ZipFile(package) as zf:
        records = {}
        for info in zf.infolist():
            name = info.filename.split("/", 1)[1]  # records sit under "<archive name>/"
            if name not in _WRITTEN_BY_WRITER:
                data = zf.read(info)
                records[name] = data.split(_COMMANDS)[0] if name.endswith(".cpp") else data
    rewritten = package.parent / "normalized" / package.name  # same name: same record prefix
    rewritten.parent.mkdir(exist_ok=True)
    with PT2ArchiveWriter(str(rewritten)) as writer:
        for name in sorted(records):
            writer.write_bytes(name, records[name])
    pin_serialization_id(rewritten)
    rewritten.replace(package)
    rewritten.parent.rmdir()


def pin_serialization_id(package: Path) -> bool:
    """Replace the random id with one derived from the contents; False if there is none."""
    data = bytearray(package.read_bytes())
    with zipfile.ZipFile(package) as zf:
        infos = [i for i in zf.infolist() if i.filename.endswith(SERIALIZATION_ID)]
        if len(infos) != 1 or infos[0].compress_type != zipfile.ZIP_STORED:
            return False
        info = infos[0]
        digest = hashlib.sha256()
        for other in sorted(zf.infolist(), key=lambda i: i.filename):
            if other is not info:
                digest.update(other.filename.encode() + struct.pack("<L", other.CRC))
        start_dir = zf.start_dir
    new_id = str(int(digest.hexdigest(), 16))[:info.file_size].zfill(info.file_size).encode()
    crc = zlib.crc32(new_id)
    local = _LOCAL_HEADER.unpack_from(data, info.header_offset)
    body = info.header_offset + _LOCAL_HEADER.size + local[9] + local[10]
    data[body:body + info.file_size] = new_id
    struct.pack_into("<L", data, info.header_offset + 14, crc)
    offset = start_dir
    while data[offset:offset + 4] == b"PK\x01\x02":
        record = _CENTRAL_HEADER.unpack_from(data, offset)
        name_length, extra_length, comment_length = record[10], record[11], record[12]
        name = bytes(data[offset + _CENTRAL_HEADER.size:offset + _CENTRAL_HEADER.size
                          + name_length]).decode()
        if name == info.filename:
            struct.pack_into("<L", data, offset + 16, crc)
        offset += _CENTRAL_HEADER.size + name_length + extra_length + comment_length
    package.write_bytes(bytes(data))
    return True
