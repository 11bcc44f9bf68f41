"""What a validation process that died said: the stage it had reached (a file it rewrites
as it goes, ``--stage-out``) and the last lines it printed, trimmed to what a person reads.

``python -m runtime run-cases`` and ``python -m exporter.lm.cases`` write their stage;
Python's faulthandler (switched on in the child's environment) prints the frame a signal
stopped, so even a crash in compiled code says which Python call it was in.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

from exporter.errors import BuildError

KEEP_IT = "--keep-failed to keep the artifact for inspection"
MAX_LINES = 6
MAX_CHARS = 300  # per line: one line of a paragraph, not a dump of a tensor
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<name>\S+)')


def read_stage(path: Path) -> str | None:
    """The child's last stage, or None where it wrote none (it died before main ran)."""
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def last_words(stdout: str, stderr: str) -> tuple[str | None, list[str]]:
    """(the line that says what killed the child, the lines around it), each trimmed.

    The headline is its own ``error:`` paragraph's first line where it printed one, a
    fatal signal's line (with the innermost Python frame faulthandler names), or else its
    last unindented line: a traceback's exception, not the runtime's frames."""
    text = _ANSI.sub("", stderr if (stderr or "").strip() else (stdout or ""))
    lines = text.strip().splitlines()
    fatal = next((i for i, line in enumerate(lines) if line.startswith("Fatal Python error")),
                 None)
    if fatal is not None:
        frame = next((m for m in map(_FRAME.match, lines[fatal:]) if m), None)
        headline = lines[fatal] + (f" in {frame['name']} ({_short(frame['file'])}:"
                                   f"{frame['line']})" if frame else "")
        return _trim(headline), [_trim(line) for line in _plain(lines[:fatal])[-MAX_LINES:]]
    plain = _plain(lines)
    errors = [i for i, line in enumerate(plain) if line.startswith("error: ")]
    if errors:  # the child's own paragraph: its first line, then its Try
        at = errors[-1]
        return _trim(plain[at][len("error: "):]), [_trim(line) for line in plain[at + 1:]
                                                   ][:MAX_LINES]
    if not plain:
        return None, []
    return _trim(plain[-1]), [_trim(line) for line in plain[-MAX_LINES:-1]]


def _plain(lines: list[str]) -> list[str]:
    return [line for line in lines if line.strip() and not line[0].isspace()
            and not line.startswith("Traceback")]


def _trim(line: str) -> str:
    line = line.strip()
    return line if len(line) <= MAX_CHARS else line[:MAX_CHARS - 3] + "..."


def _short(path: str) -> str:
    return "/".join(Path(path).parts[-3:])  # package/module, whoever's file it is


def _how(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"was killed by signal {-returncode}"


def crash_error(returncode: int, stdout: str, stderr: str, artifact: Path,
                stage: str | None = None) -> BuildError:
    """The paragraph for a validation process that exited non-zero: how it ended, the
    stage it died in, and what it printed last (also in the first line: the one a matrix
    cell or a log shows)."""
    headline, context = last_words(stdout, stderr)
    how = _how(returncode)
    where = f" while {stage}" if stage else " before it started (no stage recorded)"
    last = f"; it said: {headline}" if headline else "; it printed nothing"
    # The runtime's own exit codes (runtime.errors): it refused the artifact or its
    # inputs (2), or an executor failed (3); 1 is an exception it did not expect; a
    # signal is a crash in compiled code.
    why = {1: "the runtime raised that error while running the validation inputs; ",
           2: "the runtime refused the artifact (its error is quoted); ",
           3: "a backend failed running it (its error is quoted); "}.get(returncode)
    if why and not headline:
        why = "the process printed nothing: run the artifact by hand (`python -m runtime run`); "
    return BuildError(
        f"the validation process (loading and running the artifact) died{where}: it {how}"
        f"{last}", where=str(artifact), details=context,
        hint=(why or _crash_hint(stage)) + "run with --debug, or " + KEEP_IT)


def _crash_hint(stage: str | None) -> str:
    if stage is None or stage.startswith(("loading", "importing")):
        return "a crash on load often means a compiler/ABI problem (`exporter targets`); "
    return ("a crash while running is a backend's compiled code failing on these inputs "
            "(another --target or --dtype may avoid it); ")
