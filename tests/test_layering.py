"""The runtime is the bottom floor: importing it must not pull in exporter, passes or targets."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_runtime_imports_no_upper_room(ran):
    code = textwrap.dedent("""
        import sys
        import runtime, runtime.__main__, runtime.executors.aoti
        bad = sorted(m for m in sys.modules
                     if m.split('.')[0] in ('exporter', 'passes', 'targets'))
        print(bad)
        sys.exit(1 if bad else 0)
    """)
    proc = ran(subprocess.run, [sys.executable, "-c", code], cwd=ROOT, capture_output=True,
               text=True)
    assert proc.returncode == 0, f"runtime imported upper rooms: {proc.stdout} {proc.stderr}"


def test_runtime_sources_never_import_upper_rooms():
    for path in (ROOT / "runtime").rglob("*.py"):
        text = path.read_text()
        for room in ("exporter", "passes", "targets"):
            assert f"import {room}" not in text and f"from {room}" not in text, (path, room)


def test_passes_do_not_import_targets_or_exporter():
    for path in (ROOT / "passes").rglob("*.py"):
        text = path.read_text()
        for room in ("exporter", "targets"):
            assert f"from {room}" not in text and f"import {room}" not in text, (path, room)
