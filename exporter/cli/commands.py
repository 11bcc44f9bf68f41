"""The typer app with every command on it, in the order --help lists them (importing this
module imports every command's module, hence torch: `exporter matrix`'s warm workers
import it once for all their cells)."""

from exporter.cli import build, artifact, generate, machine, matrix  # noqa: F401  isort: skip
from exporter.cli.common import app  # noqa: E402

__all__ = ["app"]
