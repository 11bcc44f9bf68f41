"""``python -m exporter`` is the ``exporter`` console script."""

import os
import sys

try:  # a Ctrl-C before the CLI's own handler is installed: the same word, not a traceback
    from exporter.cli import main
except KeyboardInterrupt:
    print("interrupted: nothing was written", file=sys.stderr, flush=True)
    os._exit(130)

main()
