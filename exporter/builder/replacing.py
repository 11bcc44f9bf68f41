"""An artifact built from another spec is not replaced without ``--force``.

Default names come from the spec's file and factory, yet two models can still meet at one
path (``resnet.py:factory`` and ``hf:./resnet`` both write ``resnet-onnx.artifact``, or
one ``--out`` given twice).
Rebuilding the same spec replaces its artifact as before; a file that is not an artifact
this toolchain can read records no spec and is replaced as before too.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path

from exporter.errors import UserInputError
from exporter.model.spec_names import same_spec
from runtime.format.archive import MANIFEST_NAME, Limits


def check_replacing(out: Path, spec: str, force: bool) -> None:
    """Refuse (exit 2, nothing written) to replace ``out`` when another spec built it."""
    built_from = recorded_spec(out)
    if force or built_from is None or same_spec(built_from, spec):
        return
    raise UserInputError(
        f"{out} holds an artifact built from {built_from!r}, not from {spec!r}; it was not "
        "replaced", where=str(out),
        hint="give --force (force=True in Python) to replace it, or --out another path")


def recorded_spec(path: Path) -> str | None:
    """The spec that built the artifact at ``path`` (its manifest's ``source.spec``), or
    None where there is no such file or it is no artifact we can read. Only the manifest
    is read, bounded as the loader bounds it; the entries are not hashed."""
    try:
        with zipfile.ZipFile(path) as archive:
            info = archive.getinfo(MANIFEST_NAME)
            if info.file_size > Limits().max_manifest_bytes:
                return None
            with archive.open(info) as entry:
                manifest = json.loads(entry.read(Limits().max_manifest_bytes + 1))
    # not there, not a zip, no manifest, damaged or not JSON: not an artifact of ours
    except (OSError, KeyError, ValueError, EOFError, NotImplementedError, RuntimeError,
            zipfile.BadZipFile, zlib.error):
        return None
    source = manifest.get("source") if isinstance(manifest, dict) else None
    spec = source.get("spec") if isinstance(source, dict) else None
    return spec if isinstance(spec, str) else None
