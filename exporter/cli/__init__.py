"""``exporter``: the command line. It only parses flags and calls the Python API.

One module per group of commands, all on one typer app (``common.app``); the output
style, exit codes and ``--json`` envelope every command shares are in ``common``.
"""

# registers the commands, in the order --help lists them
from exporter.cli import build, artifact, machine  # noqa: F401  isort: skip
from exporter.cli.common import app


def main() -> None:
    app()
