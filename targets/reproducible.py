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

One thing differs in the compiled library itself: a oneDNN-prepacked weight's memory
descriptor, which Inductor bakes into the wrapper as ``opaque_metadata``, is oneDNN's
serialized ``memory_desc`` blob, and two of its 4-byte enum fields (data type, format
kind) are followed by 4 bytes of struct padding that oneDNN never initialises: stack
bytes that differ from run to run (``253, 127`` one build, ``252, 127`` the next; found
by serializing 57 conv and linear weights in six processes). ``canonical_mkldnn_metadata``
zeroes exactly those padding bytes while the program is compiled; the deserializer never
reads them. It does so only for the blob layout it was checked against (version 1, 772
bytes); any other is left as it is, and the manifest says so.

Written here: torch has no option for any of these.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Iterator

import torch

SERIALIZATION_ID = ".data/serialization_id"
# oneDNN's memory_desc blob (version 1, 772 bytes): padding after data_type (offset 104)
# and after format_kind (offset 312).
_MD_BLOB_SIZE, _MD_BLOB_VERSION = 772, 1
_MD_PADDING = (slice(108, 112), slice(316, 320))
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
            if name not in _WRITTEN_BY_WRITER and not _weights_copy(name):
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


def _weights_copy(name: str) -> bool:
    """The on-disk weights of a package whose weights travel apart (shared weights): read
    once at build (targets/aoti/base.py package_tensors), then dropped."""
    return name.startswith("data/weights/") or name.endswith("/weights_config.json")


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


def canonical_md(blob: torch.Tensor) -> torch.Tensor:
    """A serialized oneDNN memory descriptor with its uninitialised padding zeroed (the
    layout checked above only; any other blob is returned unchanged)."""
    if blob.dim() != 1 or blob.numel() != _MD_BLOB_SIZE or blob.dtype != torch.uint8:
        return blob
    if int.from_bytes(bytes(blob[:4].tolist()), "little") != _MD_BLOB_VERSION:
        return blob
    blob = blob.clone()
    for padding in _MD_PADDING:
        blob[padding] = 0
    return blob


@contextlib.contextmanager
def canonical_mkldnn_metadata() -> Iterator[None]:
    """While compiling: Inductor's wrapper gets every prepacked weight's descriptor
    through ``torch.ops.mkldnn._get_mkldnn_serialized_md``; give it the canonical one."""
    namespace = torch.ops.mkldnn
    try:
        original = namespace._get_mkldnn_serialized_md
    except (AttributeError, RuntimeError):  # a torch without oneDNN: nothing to fix
        yield
        return
    namespace._get_mkldnn_serialized_md = _Canonical(original)
    try:
        yield
    finally:
        namespace._get_mkldnn_serialized_md = original


@functools.cache
def mkldnn_md_layout_known() -> bool:
    """Whether this torch's oneDNN writes the descriptor layout canonical_md fixes."""
    try:
        weight = torch.ops.mkldnn._reorder_convolution_weight(
            torch.ones(8, 8, 1, 1), [0, 0], [1, 1], [1, 1], 1, [1, 8, 4, 4])
        weight = weight if weight.is_mkldnn else weight.to_mkldnn()
        blob = torch.ops.mkldnn._get_mkldnn_serialized_md(weight)
    except (AttributeError, RuntimeError, NotImplementedError):
        return True  # no oneDNN prepacking in this torch: nothing to fix
    return canonical_md(blob) is not blob


class _Canonical:
    """The op packet, called through canonical_md; everything else (``.default``, the
    schema) is the packet's own, for code that walks the namespace."""

    def __init__(self, packet) -> None:
        self._packet = packet

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        return canonical_md(self._packet(tensor))

    def __getattr__(self, name: str):
        return getattr(self._packet, name)
