"""Weight files: safetensors only, and checked against the manifest before they are read.

A safetensors file is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the bytes. The build records each file's
index (name -> dtype, shape) in its partition's ``meta["tensor_index"]``; here the
header is parsed with bounds of our own before the safetensors library sees the file,
so a pickle, a truncated file, a header whose byte ranges do not add up, or a tensor
the manifest does not describe is an ArtifactError, never an unpickle or a crash.
The hashes already say the file is the one the manifest names; this says the manifest
and the file agree with each other (a hand-edited manifest, a writer bug).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from runtime.errors import ArtifactError

INDEX_KEY = "tensor_index"
MAX_HEADER_BYTES = 100 << 20  # the safetensors library's own limit
ITEM_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2,
              "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
_REBUILD = "rebuild the artifact with `exporter build`"


def read_index(path: Path, *, where: str | None = None) -> dict[str, list]:
    """``{name: [dtype, shape]}`` from a safetensors header, after checking that it is one
    and that its byte ranges tile the data exactly."""
    where = where or path.name
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        length = _header_length(head, size, where)
        index, _ = _parse_header(fh.read(length), size - 8 - length, where)
    return index


def _bad(what: str, where: str) -> ArtifactError:
    return ArtifactError(f"the weights file is not a valid safetensors file: {what}",
                         where=where, hint=_REBUILD)


def _header_length(head: bytes, size: int, where: str) -> int:
    if len(head) < 8:
        raise _bad("the file is shorter than a safetensors header", where)
    (length,) = struct.unpack("<Q", head)
    if length > min(MAX_HEADER_BYTES, size - 8):
        raise _bad(f"the header claims {length} bytes in a {size}-byte file "
                   "(not a safetensors file: a pickle, or truncated?)", where)
    return length


def _parse_header(raw: bytes, data_bytes: int, where: str
                  ) -> tuple[dict[str, list], dict[str, list[int]]]:
    """(index, {name: data offsets}) of a header over ``data_bytes`` of tensor data."""
    try:
        header = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _bad(f"the header is not UTF-8 JSON ({exc})", where) from None
    if not isinstance(header, dict):
        raise _bad("the header is not a JSON object", where)
    header.pop("__metadata__", None)
    index, offsets_of = {}, {}
    for name, entry in header.items():
        dtype, shape, offsets = _fields(name, entry, lambda what: _bad(what, where))
        nbytes = math.prod(shape) * ITEM_BYTES[dtype]
        if offsets[1] - offsets[0] != nbytes:
            raise _bad(f"tensor '{name}' is {dtype}{shape} ({nbytes} bytes) but spans "
                       f"{offsets[1] - offsets[0]} bytes", where)
        index[name], offsets_of[name] = [dtype, shape], offsets
    cursor = 0
    for begin, end in sorted(offsets_of.values()):
        if begin != cursor:
            raise _bad("the tensors' byte ranges overlap or leave gaps", where)
        cursor = end
    if cursor != data_bytes:
        raise _bad(f"the tensors cover {cursor} bytes; the file holds {data_bytes} after "
                   "the header", where)
    return index, offsets_of


def _no_index(where: str) -> ArtifactError:
    return ArtifactError("the manifest has no index of this weights file", where=where,
                         hint=_REBUILD)


def _check_index(found: dict, expected: dict | None, where: str) -> None:
    """The file's index is the manifest's (``expected``)."""
    if not isinstance(expected, dict):
        raise _no_index(where)
    problems = [f"'{n}': the manifest says {expected[n]!r:.80}, the file has {found[n]}"
                for n in sorted(set(found) & set(expected)) if found[n] != expected[n]]
    problems += [f"'{n}' is in the file, not in the manifest" for n in sorted(set(found) - set(expected))]
    problems += [f"'{n}' is in the manifest, not in the file" for n in sorted(set(expected) - set(found))]
    if problems:
        raise ArtifactError("the weights file does not match the manifest's index",
                            where=where, details=problems[:20], hint=_REBUILD)


def load_checked(path: Path, expected: dict | None, device: str, *, where: str,
                 arrays: bool = False) -> dict[str, Any]:
    """The tensors of ``path``, once its header matches ``expected`` (the manifest's index);
    numpy arrays instead with ``arrays`` (no torch needed; ``device`` must be "cpu")."""
    if not isinstance(expected, dict):  # before the file is read
        raise _no_index(where)
    _check_index(read_index(path, where=where), expected, where)
    from safetensors import SafetensorError
    try:
        if arrays:
            from safetensors.numpy import load_file as load_arrays
            return load_arrays(str(path))
        from safetensors.torch import load_file
        return load_file(str(path), device=device)
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise ArtifactError(f"the weights cannot be read ({type(exc).__name__}: {exc})",
                            where=where, hint=_REBUILD) from exc


def load_entry_checked(reader, entry: str, expected: dict | None, *, where: str
                       ) -> dict[str, Any]:
    """The tensors of the artifact's safetensors ``entry``, read straight from the archive
    into their own (CPU) allocations, with no file in between: the header is checked
    against ``expected`` (the manifest's index) before any tensor is allocated, and the
    entry is re-hashed as it streams (ArtifactReader.stream_into)."""
    if not isinstance(expected, dict):
        raise _no_index(where)
    size = reader.manifest["entries"].get(entry, {}).get("size", 0)
    sink = _TensorSink(size, expected, where)
    reader.stream_into(entry, sink)
    return sink.tensors()


# safetensors' dtype names -> torch's (dtypes.torch_dtype)
_TORCH_NAMES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "F8_E4M3": "float8_e4m3fn",
                "F8_E5M2": "float8_e5m2", "I16": "int16", "U16": "uint16", "F16": "float16",
                "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32",
                "I64": "int64", "U64": "uint64", "F64": "float64"}


class _TensorSink:
    """A file-like sink for a safetensors stream: it gathers the header, checks it, then
    copies each tensor's bytes into that tensor as the chunks arrive (one copy, and torch's
    allocator aligns every tensor)."""

    def __init__(self, size: int, expected: dict, where: str) -> None:
        self._size, self._expected, self._where = size, expected, where
        self._head = bytearray()
        self._spans: list[tuple[int, int, memoryview]] | None = None  # data offsets, bytes
        self._next = 0  # the span being filled
        self._made: dict[str, Any] = {}
        self._at = 0  # bytes of tensor data written

    def write(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        if self._spans is None:
            view = self._take_header(view)
        while len(view) and self._next < len(self._spans):
            begin, end, target = self._spans[self._next]
            n = min(len(view), end - self._at)
            target[self._at - begin:self._at - begin + n] = view[:n]
            self._at += n
            view = view[n:]
            self._next += self._at == end
        if len(view):
            raise _bad("bytes after the last tensor", self._where)

    def tensors(self) -> dict[str, Any]:
        if len(self._head) < 8:
            raise _bad("the file is shorter than a safetensors header", self._where)
        if self._spans is None or self._next < len(self._spans):
            raise _bad("the entry ends before its tensors do", self._where)
        return self._made

    def _take_header(self, view: memoryview) -> memoryview:
        need = 8 - len(self._head)
        if need > 0:
            self._head += view[:need]
            view = view[need:]
            if len(self._head) < 8:
                return view
        length = _header_length(bytes(self._head[:8]), self._size, self._where)
        missing = 8 + length - len(self._head)
        self._head += view[:missing]
        view = view[missing:]
        if len(self._head) < 8 + length:
            return view
        index, offsets = _parse_header(self._head[8:], self._size - 8 - length, self._where)
        _check_index(index, self._expected, self._where)
        self._spans = self._allocate(index, offsets)
        return view

    def _allocate(self, index: dict, offsets: dict) -> list[tuple[int, int, memoryview]]:
        import torch
        spans = []
        for name, (dtype, shape) in index.items():
            tensor = torch.empty(shape, dtype=getattr(torch, _TORCH_NAMES[dtype]))
            self._made[name] = tensor
            begin, end = offsets[name]
            if end > begin:
                raw = tensor.reshape(-1).view(torch.uint8).numpy()
                spans.append((begin, end, memoryview(raw).cast("B")))
        return sorted(spans, key=lambda span: span[0])


def _fields(name: str, entry: object, _bad) -> tuple[str, list[int], list[int]]:
    if not isinstance(entry, dict):
        raise _bad(f"tensor '{name}' has no record")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in ITEM_BYTES:
        raise _bad(f"tensor '{name}' has an unknown dtype {dtype!r}")
    for label, values, count in (("shape", shape, None), ("data_offsets", offsets, 2)):
        if (not isinstance(values, list) or (count is not None and len(values) != count)
                or not all(type(v) is int and 0 <= v < 1 << 62 for v in values)):
            raise _bad(f"tensor '{name}' has a malformed {label} {values!r}")
    if offsets[0] > offsets[1]:
        raise _bad(f"tensor '{name}' ends before it begins")
    return dtype, shape, offsets

