"""A bundle's install.sh and run.sh. Both check the bundle's files against SHA256SUMS
before anything else and stop (exit 2) on any mismatch or a missing ``sha256sum``; run.sh
also carries the SHA-256 of each artifact it was written for, so an artifact swapped in
together with a rewritten SHA256SUMS is still refused (unless run.sh is rewritten too:
that takes a signature, see docs/trust.md). The only text put into them is checked here:
artifact names (plain file names), their hex digests, the Python version and the CPU
architecture the wheels are for.
"""

from __future__ import annotations

import re

from exporter.errors import UserInputError

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_DIGEST = re.compile(r"[0-9a-f]{64}")
_PYTHON = re.compile(r"3\.[0-9]{1,2}")
ARCH = re.compile(r"[a-z0-9_]{1,20}")

# Every bundle script's start: checked takes SHA256SUMS lines on stdin, in the bundle's folder.
_CHECK = """\
refuse() { echo "$0: refused: $*" >&2; exit 2; }
command -v sha256sum >/dev/null 2>&1 ||
    refuse "sha256sum (GNU coreutils) is needed to check this bundle's files"
[ -f "$here/SHA256SUMS" ] || refuse "$here/SHA256SUMS is missing"
checked() ( cd "$here" && sha256sum --check --strict --quiet - >&2 )
"""
_PINNED = """\
pinned() {
    case "$1" in
@CASES@        *) echo "" ;;
    esac
}
"""
# Every run.sh's $artifact (a name in artifacts/ or a path), held to what pinned says.
PINNED_ARTIFACT = """\
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
"""


def check_block(artifacts: dict[str, str] | None = None) -> str:
    """The shell functions a bundle script starts with: refuse and checked, and with
    ``artifacts`` (file name -> SHA-256) pinned NAME, printing its SHA-256 (or nothing)."""
    if artifacts is None:
        return _CHECK
    cases = []
    for name, digest in sorted(artifacts.items()):
        if not _SAFE_NAME.fullmatch(name) or not _DIGEST.fullmatch(digest):
            raise UserInputError(f"an artifact's name {name!r} cannot be written into run.sh",
                                 hint="rename the artifact: letters, digits, '._+-'")
        cases.append(f"        {name}) echo {digest} ;;\n")
    return _CHECK + _PINNED.replace("@CASES@", "".join(cases))


def install_script(python: str, arch: str) -> str:
    """install.sh: every file checked, then an offline install of the bundle's wheels
    (for CPython ``python`` on ``arch``, as ``uname -m`` says it)."""
    if not _PYTHON.fullmatch(python) or not ARCH.fullmatch(arch):
        raise UserInputError(f"unexpected Python version {python!r} or architecture {arch!r}")
    return _INSTALL.replace("@CHECK@", check_block()).replace("@PYTHON@", python).replace(
        "@ARCH@", arch)


def run_script(artifacts: dict[str, str]) -> str:
    """run.sh, pinning ``artifacts`` (file name -> SHA-256)."""
    return _RUN.replace("@CHECK@", check_block(artifacts)).replace("@ARTIFACT@",
                                                                     PINNED_ARTIFACT)


_INSTALL = """#!/bin/sh
# A new virtual environment (default: .venv next to this script) with exactly the wheels
# in wheels/: offline (--no-index), each file checked against the SHA-256 that
# requirements.lock pins (--require-hashes), after every file of the bundle is checked
# against SHA256SUMS. pip installs into the new venv from outside it (pip --python), so
# the device's venv holds what runs the artifacts, not the installer: $PYTHON's own pip
# where it has 22.3+ (--python), else a throwaway venv's (ensurepip, seconds more);
# bytecode is written as modules are first imported (--no-compile). The wheels are for
# CPython @PYTHON@ on Linux @ARCH@ (exporter package --platform). To add packages later:
# .venv/bin/python -m ensurepip, then .venv/bin/python -m pip install ...
set -eu
here=$(cd "$(dirname "$0")" && pwd)
@CHECK@checked < "$here/SHA256SUMS" || refuse "files of this bundle do not match SHA256SUMS \\
(above): it is damaged or was changed; get the bundle again"
machine=$(uname -m)
[ "$machine" = @ARCH@ ] ||
    refuse "the bundle's wheels are for @ARCH@ and this machine is $machine; make a bundle \\
for it with exporter package --platform"
venv=${1:-$here/.venv}
python=${PYTHON:-python3}
found=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])') ||
    refuse "no Python at $python (set PYTHON)"
[ "$found" = @PYTHON@ ] ||
    refuse "the bundle's wheels are for Python @PYTHON@; $python is $found (set PYTHON)"
"$python" -m venv --without-pip "$venv"
installer=$python
if ! "$python" -c 'import sys, pip
sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (22, 3))' 2>/dev/null; then
    tools=$(mktemp -d)
    trap 'rm -rf "$tools"' EXIT
    "$python" -m venv "$tools"
    installer=$tools/bin/python
fi
# no pip configuration of this machine applies: the lock and wheels/ are the whole input
PIP_CONFIG_FILE=/dev/null "$installer" -m pip --isolated --python "$venv/bin/python" \\
    install --quiet --disable-pip-version-check --no-compile --no-index \\
    --find-links "$here/wheels" --only-binary=:all: --require-hashes \\
    -r "$here/requirements.lock"
echo "installed into $venv; $here/run.sh --help says how to run the artifacts"
"""

_RUN = """#!/bin/sh
# Usage: run.sh ARTIFACT --inputs in.npz [--out out.npz] [--trusted-key KEY.pub]
#        run.sh generate ARTIFACT --prompt TEXT [-n N] [--json]   (--task text-generation)
# ARTIFACT: a file name in artifacts/ or a path. PYTHON overrides the venv's python.
# First the bundle's files (all but wheels/, which install.sh checked) are checked against
# SHA256SUMS, and an artifact of this bundle against the SHA-256 this script pins.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
@CHECK@usage() {
    echo "usage: ./run.sh ARTIFACT --inputs in.npz [--out out.npz] [--trusted-key KEY.pub]"
    echo "       ./run.sh generate ARTIFACT --prompt TEXT [-n N] [--json]"
    echo "artifacts in this bundle:"; ls "$here/artifacts"
}
grep -v '^[0-9a-f]*  wheels/' "$here/SHA256SUMS" | checked || refuse "files of this \\
bundle do not match SHA256SUMS (above): it is damaged or was changed; nothing was run"
if [ $# -eq 0 ]; then usage >&2; exit 2; fi
case "$1" in -h|--help) usage; exit 0 ;; esac
command=run
if [ "$1" = generate ]; then
    command=generate; shift
    if [ $# -eq 0 ]; then usage >&2; exit 2; fi
fi
artifact=$1; shift
@ARTIFACT@exec "${PYTHON:-$here/.venv/bin/python}" -m runtime "$command" "$artifact" "$@"
"""
