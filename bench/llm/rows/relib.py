"""An onnx artifact with its kernel library (targets/onnx/kernels) recompiled from the
sources as they are now, everything else as built: an A/B of a kernel change on a real
model without the build's quantize step (~10 min for the 300M).

    python -m bench.llm.rows.relib ARTIFACT OUT
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from exporter.ship.archive_writer import write_artifact
from runtime.format.archive import ArtifactReader
from targets.onnx.kernels import LIBRARY, compile_library


def relib(artifact: Path, out: Path) -> list[str]:
    """Writes ``out``; the library entries it replaced."""
    with ArtifactReader.open(artifact) as reader:
        manifest = dict(reader.manifest)
        files = {name: reader.read_bytes(name) for name in reader.names()}
    replaced = [name for name in files if Path(name).name == LIBRARY]
    if not replaced:
        raise SystemExit(f"{artifact}: no {LIBRARY} (built with --no-own-kernels?)")
    with tempfile.TemporaryDirectory() as tmp:
        library = compile_library(Path(tmp) / LIBRARY).read_bytes()
    write_artifact(out, manifest, {**files, **dict.fromkeys(replaced, library)})
    return replaced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    print(f"{args.out}: {', '.join(relib(args.artifact, args.out))} recompiled")


if __name__ == "__main__":
    main()
