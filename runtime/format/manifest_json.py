"""Check 5 of the artifact reader (runtime/format/archive.py): ``manifest.json``'s bytes as a
JSON object of a format version this runtime reads, with a well-formed entry list.
Strict on purpose: duplicate keys and NaN/Infinity are refused, since two readers could
read them differently."""

from __future__ import annotations

import json
from typing import Callable

from runtime.errors import ArtifactError, CompatibilityError

FORMAT_NAME = "edge-export-artifact"
FORMAT_VERSION = "1.0"  # major.minor; the reader rejects an unknown major, accepts a higher minor
_MAJOR = int(FORMAT_VERSION.split(".")[0])


def parse_manifest(raw: bytes, bad: Callable[[str], ArtifactError], *, where: str) -> dict:
    """The manifest object, or ``bad(what)`` raised (CompatibilityError for a newer major)."""
    try:
        manifest = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys,
                              parse_constant=_no_constants)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise bad(f"manifest is not valid UTF-8 JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise bad("manifest is not a JSON object")
    _check_format(manifest.get("format"), bad, where)
    entries = manifest.get("entries")
    if not isinstance(entries, dict):
        raise bad("manifest has no 'entries' object")
    for name, meta in entries.items():
        sha, size = (meta.get("sha256"), meta.get("size")) if isinstance(meta, dict) else (0, 0)
        if (not isinstance(sha, str) or len(sha) != 64 or sha.strip("0123456789abcdef")
                or type(size) is not int or size < 0):
            raise bad(f"manifest record for entry {name!r} needs a lowercase hex 'sha256' "
                      "and a non-negative integer 'size'")
    return manifest


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    # Two readers could pick different values for a duplicated key; refuse the ambiguity.
    result: dict = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r} in a JSON object")
        result[key] = value
    return result


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _check_format(fmt: object, bad, where: str) -> None:
    if not isinstance(fmt, dict) or fmt.get("name") != FORMAT_NAME:
        raise bad(f"manifest format is not {FORMAT_NAME!r}")
    version = fmt.get("version")
    parts = version.split(".") if isinstance(version, str) else []
    if len(parts) != 2 or not all(p.isascii() and p.isdigit() for p in parts):
        raise bad(f"manifest format version {version!r} is not 'major.minor'")
    if int(parts[0]) != _MAJOR:
        raise CompatibilityError(
            f"artifact format version {version} is not supported; this toolchain reads "
            f"version {FORMAT_VERSION} (major {_MAJOR})", where=where,
            hint=f"use a toolchain release that reads format {parts[0]}.x, or rebuild the "
                 "artifact with this toolchain")
