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

    def _bad(what: str) -> ArtifactError:
        return ArtifactError(f"the weights file is not a valid safetensors file: {what}",
                             where=where, hint=_REBUILD)

    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise _bad("the file is shorter than a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise _bad(f"the header claims {length} bytes in a {size}-byte file "
                             "(not a safetensors file: a pickle, or truncated?)")
        try:
            header = json.loads(fh.read(length).decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise _bad(f"the header is not UTF-8 JSON ({exc})") from None
    if not isinstance(header, dict):
        raise _bad("the header is not a JSON object")
    header.pop("__metadata__", None)
    index, ranges = {}, []
    for name, entry in header.items():
        dtype, shape, offsets = _fields(name, entry, _bad)
        nbytes = math.prod(shape) * ITEM_BYTES[dtype]
        if offsets[1] - offsets[0] != nbytes:
            raise _bad(f"tensor '{name}' is {dtype}{shape} ({nbytes} bytes) but spans "
                             f"{offsets[1] - offsets[0]} bytes")
        index[name] = [dtype, shape]
        ranges.append(offsets)
    cursor = 0
    for begin, end in sorted(ranges):
        if begin != cursor:
            raise _bad("the tensors' byte ranges overlap or leave gaps")
        cursor = end
    if cursor != size - 8 - length:
        raise _bad(f"the tensors cover {cursor} bytes; the file holds "
                         f"{size - 8 - length} after the header")
    return index


def load_checked(path: Path, expected: dict | None, device: str, *, where: str,
                 arrays: bool = False) -> dict[str, Any]:
    """The tensors of ``path``, once its header matches ``expected`` (the manifest's index);
    numpy arrays instead with ``arrays`` (no torch needed; ``device`` must be "cpu")."""
    if not isinstance(expected, dict):
        raise ArtifactError("the manifest has no index of this weights file", where=where,
                            hint=_REBUILD)
    found = read_index(path, where=where)
    problems = [f"'{n}': the manifest says {expected[n]!r:.80}, the file has {found[n]}"
                for n in sorted(set(found) & set(expected)) if found[n] != expected[n]]
    problems += [f"'{n}' is in the file, not in the manifest" for n in sorted(set(found) - set(expected))]
    problems += [f"'{n}' is in the manifest, not in the file" for n in sorted(set(expected) - set(found))]
    if problems:
        raise ArtifactError("the weights file does not match the manifest's index",
                            where=where, details=problems[:20], hint=_REBUILD)
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

