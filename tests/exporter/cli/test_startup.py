"""Commands that need no torch start without importing it: --version, --help, inspect,
targets, and a typo'd path's error, in a process where `import torch` fails."""

import json
import subprocess
import sys

from tests.conftest import ROOT
from tests.helpers import BLOCK_TORCH


def _exporter_without_torch(ran, *args: str) -> subprocess.CompletedProcess:
    code = BLOCK_TORCH + (f"sys.argv = {['exporter', *args]!r}\n"
                          "from exporter.cli import main\nmain()\n")
    return ran(subprocess.run, [sys.executable, "-c", code], cwd=ROOT, capture_output=True,
               text=True, timeout=120, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_version_help_and_inspect_run_where_torch_cannot_be_imported(ran, onnx_mlp):
    version = _exporter_without_torch(ran, "--version")
    assert version.returncode == 0 and version.stdout.startswith("exporter "), version.stderr
    helped = _exporter_without_torch(ran, "--help")
    assert helped.returncode == 0 and "build" in helped.stdout, helped.stderr
    build_help = _exporter_without_torch(ran, "build", "--help")
    assert build_help.returncode == 0 and "--quant-block" in build_help.stdout, build_help.stderr
    summary = _exporter_without_torch(ran, "inspect", str(onnx_mlp))
    assert summary.returncode == 0 and "target onnx" in summary.stdout, summary.stderr
    inspected = _exporter_without_torch(ran, "inspect", str(onnx_mlp), "--json")
    assert inspected.returncode == 0, inspected.stderr
    assert json.loads(inspected.stdout)["manifest"]["target"] == "onnx"


def test_targets_and_a_missing_artifact_answer_without_torch(ran, tmp_path):
    listed = _exporter_without_torch(ran, "targets", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)["targets"]}
    assert {"cpu", "cuda", "onnx", "tvm", "executorch"} <= set(rows)
    missing = _exporter_without_torch(ran, "inspect", str(tmp_path / "typo.artifact"))
    assert missing.returncode == 2 and missing.stderr.startswith("error: "), missing.stderr


def test_doctor_says_torch_is_missing_and_still_lists_the_targets(ran):
    checked = _exporter_without_torch(ran, "doctor", "--json")
    assert checked.returncode == 0, checked.stderr
    rows = {row["name"]: row for row in json.loads(checked.stdout)["checks"]}
    assert rows["torch"]["status"] == "problem" and "pip install" in rows["torch"]["fix"]
    assert "target onnx" in rows


def test_a_target_card_and_its_implementation_say_the_same():
    """The registry answers --help and `exporter targets` from each target's card; a
    build reads the Target. Both must name the same recipes, baselines and availability."""
    from targets.registry import all_targets, described
    for name, target in all_targets().items():
        card = described()[name]
        assert card.recipes == tuple(target.quantization.recipes), name
        assert card.baselines == tuple(target.tooling.baselines()), name
        found = target.availability()
        assert card.check() == (found.ok, found.reason), name


def test_a_target_in_capitals_or_a_misspelled_recipe_is_told_its_near_name_before_torch(ran):
    upper = _exporter_without_torch(ran, "build", "zoo:mlp", "--target", "ONNX", "--dry-run")
    assert upper.returncode == 2 and "did you mean 'onnx'?" in upper.stderr, upper.stderr
    recipe = _exporter_without_torch(ran, "build", "zoo:mlp", "--quantize", "int8-dynamc")
    assert recipe.returncode == 2 and "did you mean 'int8-dynamic'?" in recipe.stderr, (
        recipe.stderr)


def test_doctor_fixes_install_an_extra_by_the_clones_path_from_any_folder(tmp_path, monkeypatch):
    """`pip install '.[onnx]'` works only in the clone's root; the fix names the clone."""
    from exporter.doctor import _package
    monkeypatch.chdir(tmp_path)
    row = _package("no-such-distribution-here", "onnx", "target onnx")
    assert row.status == "absent" and row.fix == f"pip install '{ROOT}[onnx]'"


def test_a_misspelled_model_file_is_told_its_near_file_before_torch(ran):
    typo = _exporter_without_torch(ran, "build", "tests/models/statefull.py:export_differs")
    assert typo.returncode == 2, typo.stderr
    assert "did you mean 'stateful.py'?" in typo.stderr, typo.stderr
    assert "tests/models/stateful.py:export_differs" in typo.stderr and "Traceback" not in (
        typo.stderr)
    as_json = _exporter_without_torch(ran, "build", "tests/models/Stateful.py:f", "--json")
    assert as_json.returncode == 2, as_json.stderr
    assert "did you mean 'stateful.py'?" in json.loads(as_json.stdout)["error"]["what"]
