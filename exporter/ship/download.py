"""The wheels a bundle carries: one per locked distribution, for this host's Python and
the bundle's platform (``--platform``: pip's wheel tags for it), fetched by ``pip
download`` with the user's own pip configuration (index, mirror, find-links); PyTorch's
labelled builds (torch 2.13.0+cpu, for x86_64 and aarch64) from PyTorch's index of that
label when the user's has none. The lock pins the SHA-256 of exactly these files and the device
installs only them (``--no-index --require-hashes``), so what runs there is what was
resolved here, whatever an index serves later.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from exporter.errors import UserInputError
from exporter.ship.lock import PYTORCH_INDEX
from runtime.host.platforms import get_platform, host_platform

log = logging.getLogger(__name__)


def download_wheels(pins: dict[str, Version], dest: Path, platform: str | None = None
                    ) -> dict[str, Path]:
    """Canonical name -> the wheel for that pin and ``platform`` (default: this one),
    saved in ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    platform = platform or host_platform()
    tags = wheel_tag_options(platform)
    plain = {n: v for n, v in pins.items() if not v.local}
    if plain:
        _pip_download(plain, dest, *tags)
    for label in sorted({v.local for v in pins.values() if v.local}):
        labelled = {n: v for n, v in pins.items() if v.local == label}
        # the user's index may mirror PyTorch's variants; if not, PyTorch's own serves them
        if not _pip_download(labelled, dest, *tags, fail=False):
            _pip_download(labelled, dest, *tags, "--extra-index-url", PYTORCH_INDEX + label)
    return _matched(pins, dest)


def wheel_tag_options(platform: str) -> list[str]:
    """pip's options for another platform's wheels (none for this one): its manylinux
    tags from its glibc baseline down to manylinux2014, this Python's version."""
    if platform == host_platform():
        return []
    options = [f"--platform={tag}" for tag in get_platform(platform).wheel_tags()]
    return [*options, "--python-version=%d.%d" % sys.version_info[:2], "--implementation=cp"]


def _pip_download(pins: dict[str, Version], dest: Path, *extra: str, fail: bool = True) -> bool:
    requirements = [f"{name}=={version}" for name, version in sorted(pins.items())]
    log.info("pip download %s", " ".join(requirements))
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                           "--only-binary=:all:", "--disable-pip-version-check", "--quiet",
                           "--dest", str(dest), *extra, *requirements],
                          capture_output=True, text=True)
    if done.returncode == 0 or not fail:
        return done.returncode == 0
    tail = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()][-6:]
    raise UserInputError(f"pip could not download the wheels the bundle carries "
                         f"({len(requirements)} pinned: {', '.join(requirements[:4])}"
                         f"{', ...' if len(requirements) > 4 else ''})",
                         where="pip download (your pip configuration's index)", details=tail,
                         hint="check the network or your pip index (pip config list); a "
                         "bundle carries a wheel for each locked package, built wheels "
                         "only, for this Python and the bundle's platform (--platform)")


def _matched(pins: dict[str, Version], dest: Path) -> dict[str, Path]:
    """The downloaded file of each pin, by its wheel file name (PEP 427)."""
    found: dict[str, Path] = {}
    for path in sorted(dest.glob("*.whl")):
        try:
            name, version, _, _ = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if pins.get(name) == version:
            found[name] = path
    missing = sorted(set(pins) - set(found))
    if missing:
        raise UserInputError(f"pip downloaded no wheel for {', '.join(missing)}",
                             where=str(dest), hint="check your pip index serves "
                             + ", ".join(f"{n}=={pins[n]}" for n in missing))
    return found
