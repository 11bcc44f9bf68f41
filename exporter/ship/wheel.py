"""A wheel of the ``runtime`` package alone, for ``exporter package`` bundles.

Written here rather than with setuptools/``pip wheel``: those need the source tree and a
build environment (which pip fills from the network), while this runs from any install
of the exporter, offline, and gives the same bytes for the same sources (fixed file
times and order), so a bundle's hash says whether its runtime changed. A wheel is a zip
with three metadata files (PEP 427/491); nothing else is needed to ``pip install`` it.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import runtime
from exporter.versions import toolchain_version
from targets import all_targets

DIST_NAME = "edge-runtime"
_FIXED_TIME = (2020, 1, 1, 0, 0, 0)  # reproducible zip entries

# What the runtime imports: numpy always; torch (and safetensors) only for artifacts with
# partitions that need it, a backend's library only when an artifact has a partition for
# it (runtime/program/requires.py; the executors import them lazily).
BASE_REQUIRES = ("numpy>=1.26",)
# Each target names its own extra (Target.packaging.runtime_extra); torch, signing and
# generate (text prompts of generating artifacts) are the runtime's.
RUNTIME_EXTRAS = {"torch": ("torch>=2.11", "safetensors>=0.4"),
                  "signing": ("cryptography>=42",), "generate": ("tokenizers>=0.15",)}


def extras() -> dict[str, tuple[str, ...]]:
    found = dict(t.packaging.runtime_extra for t in all_targets().values()
                 if t.packaging.runtime_extra)
    return {**dict(sorted(found.items())), **RUNTIME_EXTRAS}


def wheel_name() -> str:
    return f"{DIST_NAME.replace('-', '_')}-{toolchain_version()}-py3-none-any.whl"


def build_runtime_wheel(out_dir: Path) -> Path:
    """Write the wheel into ``out_dir`` and return its path."""
    package = Path(runtime.__file__).parent
    sources = sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)
    dist_info = f"{DIST_NAME.replace('-', '_')}-{toolchain_version()}.dist-info"
    files = {f"runtime/{p.relative_to(package).as_posix()}": p.read_bytes() for p in sources}
    files[f"{dist_info}/METADATA"] = _metadata().encode()
    files[f"{dist_info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: edge-exporter\n"
                                   b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    files[f"{dist_info}/entry_points.txt"] = (b"[console_scripts]\n"
                                              b"edge-runtime = runtime.__main__:console\n")
    record = [f"{name},sha256={_digest(data)},{len(data)}" for name, data in files.items()]
    files[f"{dist_info}/RECORD"] = ("\n".join(record + [f"{dist_info}/RECORD,,"]) + "\n").encode()
    path = out_dir / wheel_name()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            wheel.writestr(info, data)
    return path


def _metadata() -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {DIST_NAME}", f"Version: {toolchain_version()}",
             "Summary: Loads, verifies and runs edge-exporter artifacts",
             "Requires-Python: >=3.11", *(f"Requires-Dist: {r}" for r in BASE_REQUIRES)]
    for extra, requires in extras().items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in requires]
    return "\n".join(lines) + "\n"


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
