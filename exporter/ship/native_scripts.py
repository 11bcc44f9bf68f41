"""A native bundle's run.sh: every file checked against SHA256SUMS, the artifact against
the SHA-256 run.sh pins (as the Python bundle's run.sh, exporter/ship/scripts.py), the
machine's architecture against the bundle's, then bin/edge-run with the bundle's lib/ first
on the library path. The only text put into it is checked here: artifact names (plain file
names), their hex digests and the architecture.
"""

from __future__ import annotations

import re

from exporter.errors import UserInputError
from exporter.ship.scripts import _CHECK

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_DIGEST = re.compile(r"[0-9a-f]{64}")
_ARCH = re.compile(r"[a-z0-9_]{1,20}")


def native_run_script(artifacts: dict[str, str], arch: str) -> str:
    """run.sh for a native bundle for ``arch`` (as ``uname -m`` says it), pinning
    ``artifacts`` (file name -> SHA-256)."""
    if not _ARCH.fullmatch(arch):
        raise UserInputError(f"unexpected architecture {arch!r}")
    cases = []
    for name, digest in sorted(artifacts.items()):
        if not _SAFE_NAME.fullmatch(name) or not _DIGEST.fullmatch(digest):
            raise UserInputError(f"an artifact's name {name!r} cannot be written into run.sh",
                                 hint="rename the artifact: letters, digits, '._+-'")
        cases.append(f"        {name}) echo {digest} ;;\n")
    return _RUN.replace("@CHECK@", _CHECK).replace("@PINNED@", "".join(cases)).replace(
        "@ARCH@", arch)


_RUN = """#!/bin/sh
# Usage: run.sh ARTIFACT --inputs in.npz --out out.npz [--public-key KEY.pub] [--json]
# ARTIFACT: a file name in artifacts/ or a path. Runs bin/edge-run, the native runner (no
# Python), with this bundle's lib/ first on the library path. First every file of the
# bundle is checked against SHA256SUMS, and an artifact of this bundle against the SHA-256
# this script pins.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
@CHECK@pinned() {
    case "$1" in
@PINNED@        *) echo "" ;;
    esac
}
usage() {
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
[ -f "$artifact" ] || artifact=$here/artifacts/$artifact
[ -f "$artifact" ] || refuse "no artifact $artifact"
# an artifact in this bundle's artifacts/ runs only if SHA256SUMS (checked above) gives it
# the SHA-256 this script pins; a file elsewhere is the caller's own choice
folder=$(cd "$(dirname "$artifact")" && pwd -P)
if [ "$folder" = "$(cd "$here/artifacts" && pwd -P)" ]; then
    name=$(basename "$artifact")
    want=$(pinned "$name")
    [ -n "$want" ] || refuse "artifacts/$name is not one of the artifacts this bundle was made with"
    listed=$(awk -v p="artifacts/$name" '$2 == p { print $1 }' "$here/SHA256SUMS")
    [ "$listed" = "$want" ] || refuse "artifacts/$name is not the artifact this bundle was \\
made with (its SHA-256 differs from the one run.sh pins); nothing was run"
fi
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
exec "$here/bin/edge-run" "$artifact" "$@"
"""
