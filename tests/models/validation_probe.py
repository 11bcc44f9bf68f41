"""``python -m tests.models.validation_probe MODE WORDS...``: what a validation process
sees at its start, as one JSON line on stdout (tests/exporter/validation/
test_validation_process.py); MODE ``exit3``, ``raise``, ``segv`` or ``sleep`` ends it so."""

import json
import os
import signal
import sys
import time

seen = {"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv[1:], "cwd": os.getcwd(),
        "probe_env": os.environ.get("EDGE_PROBE"), "path0": sys.path[0],
        "hf_offline": os.environ.get("HF_HUB_OFFLINE"), "columns": os.environ.get("COLUMNS"),
        "preloaded": "torch" in sys.modules, "name": __name__,
        "build_side": sorted(m for m in sys.modules if m.startswith("exporter.builder"))}
print(json.dumps(seen), flush=True)
print("probe: on stderr", file=sys.stderr, flush=True)
mode = sys.argv[1]
if mode == "exit3":
    sys.exit(3)
if mode == "raise":
    raise RuntimeError("the probe raised")
if mode == "segv":
    os.kill(os.getpid(), signal.SIGSEGV)
if mode == "sleep":
    time.sleep(60)
