"""The kernels each AOTInductor library of built artifacts loads, and the differences
between two builds: what a pass changed in the compiled step, read from the packages'
generated wrapper source without loading them (torch's package loader crashed loading
test libraries on the GPU machine; the runtime loads the real ones).

    python bench/library_kernels.py A.artifact [B.artifact]

Per package (each ``*.pt2`` entry of an artifact's zip): the kernels it loads, and its
wrapper's calls that copy or clone a tensor (a copy of a buffer a kernel writes shows up
as either; not the GPU wrapper's clone of an input misaligned at run time). With two
artifacts, the kernels only one of them loads, package by package (the same relative
path). One JSON line per artifact, then one for the difference.
"""

from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path

USAGE = "usage: python bench/library_kernels.py A.artifact [B.artifact]"
_LOADED = re.compile(r'loadKernel\(\s*(?:"[^"]*"|\w+)\s*,\s*"(\w+)"')
_COPIES = re.compile(r"aoti_torch_(?:copy_|clone)\w*\(")
# the GPU wrapper's guard on each input: a clone only where the input is misaligned at
# run time (AOTInductor's codegen_inputs), not a copy the compiled step makes
_ALIGNMENT = re.compile(r"aoti_torch_clone_preserve_strides\((\w+), &\1_aligned\)")


def copy_calls(source: str) -> list[str]:
    """A wrapper source's calls that copy or clone a tensor, less the inputs' alignment
    guards."""
    return _COPIES.findall(_ALIGNMENT.sub("", source))


def library_kernels(artifact: Path) -> dict[str, dict]:
    """{package path in ``artifact``: {"kernels": sorted names, "copies": calls}}."""
    found = {}
    with zipfile.ZipFile(artifact) as outer:
        # the artifact stores its packages uncompressed: each opens in place, seekable
        for name in sorted(n for n in outer.namelist() if n.endswith(".pt2")):
            with outer.open(name) as stream, zipfile.ZipFile(stream) as package:
                source = "\n".join(package.read(entry).decode(errors="replace")
                                   for entry in package.namelist() if entry.endswith(".cpp"))
            found[name] = {"kernels": sorted(set(_LOADED.findall(source))),
                           "copies": len(copy_calls(source))}
    return found


def difference(first: dict[str, dict], second: dict[str, dict]) -> dict[str, dict]:
    """Per package both have: the kernels only the first loads, only the second, and
    the change in copy calls; packages with no difference are left out."""
    changed = {}
    for name in sorted(set(first) & set(second)):
        a, b = set(first[name]["kernels"]), set(second[name]["kernels"])
        copies = second[name]["copies"] - first[name]["copies"]
        if a != b or copies:
            changed[name] = {"only_first": sorted(a - b), "only_second": sorted(b - a),
                             "copies_added": copies}
    return changed


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2 or not all(zipfile.is_zipfile(a) for a in argv):
        print(USAGE, file=sys.stderr)
        return 2
    listed = [library_kernels(Path(a)) for a in argv]
    for artifact, found in zip(argv, listed):
        print(json.dumps({"artifact": artifact, "libraries": found}))
    if len(listed) == 2:
        print(json.dumps({"difference": difference(*listed)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
