"""``python -m exporter`` is the ``exporter`` console script."""

from exporter.cli import main

main()
