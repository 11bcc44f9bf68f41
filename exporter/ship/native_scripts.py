"""A native bundle's run.sh: every file checked against SHA256SUMS, the artifact against
the SHA-256 run.sh pins (as the Python bundle's run.sh, exporter/ship/scripts.py), the
machine's architecture against the bundle's, then bin/edge-run with the bundle's lib/ first
on the library path. The only text put into it is checked here: artifact names (plain file
names), their hex digests and the architecture.
"""

from __future__ import annotations

from exporter.errors import UserInputError
from exporter.ship.scripts import ARCH, PINNED_ARTIFACT, check_block


def native_run_script(artifacts: dict[str, str], arch: str) -> str:
    """run.sh for a native bundle for ``arch`` (as ``uname -m`` says it), pinning
    ``artifacts`` (file name -> SHA-256)."""
    if not ARCH.fullmatch(arch):
        raise UserInputError(f"unexpected architecture {arch!r}")
    return _RUN.replace("@CHECK@", check_block(artifacts)).replace(
        "@ARTIFACT@", PINNED_ARTIFACT).replace("@ARCH@", arch)


_RUN = """#!/bin/sh
# Usage: run.sh ARTIFACT --inputs in.npz --out out.npz [--public-key KEY.pub] [--json]
# ARTIFACT: a file name in artifacts/ or a path. Runs bin/edge-run, the native runner (no
# Python), with this bundle's lib/ first on the library path. First every file of the
# bundle is checked against SHA256SUMS, and an artifact of this bundle against the SHA-256
# this script pins.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
@CHECK@usage() {
    echo "usage: ./run.sh ARTIFACT --inputs in.npz --out out.npz [--public-key KEY.pub] [--json]"
    echo "artifacts in this bundle:"; ls "$here/artifacts"
}
checked < "$here/SHA256SUMS" || refuse "files of this bundle do not match SHA256SUMS \\
(above): it is damaged or was changed; nothing was run"
machine=$(uname -m)
[ "$machine" = @ARCH@ ] ||
    refuse "this bundle's runner is for @ARCH@ and this machine is $machine; make a bundle \\
for it with exporter package --native --platform"
if [ $# -eq 0 ]; then usage >&2; exit 2; fi
case "$1" in -h|--help) usage; exit 0 ;; esac
artifact=$1; shift
@ARTIFACT@LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
exec "$here/bin/edge-run" "$artifact" "$@"
"""
