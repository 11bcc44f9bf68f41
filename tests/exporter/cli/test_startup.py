"""Commands that need no torch start without importing it: --version, --help, inspect,
targets, and a typo'd path's error, in a process where `import torch` fails."""

import json
import os
import signal
import subprocess
import sys
import time

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


def test_install_hints_outside_doctor_name_the_clone_too(monkeypatch, tmp_path):
    """An hf: spec without transformers and the executorch target said `pip install
    '.[hf]'`, which fails outside the clone's root."""
    import pytest

    from exporter.errors import SpecError
    from exporter.model.hf_spec import HfOptions, load_pretrained
    from targets.card import install_command
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails
    with pytest.raises(SpecError) as caught:
        load_pretrained("hf:./x", "./x", HfOptions())
    assert caught.value.hint == install_command("hf") == f"pip install '{ROOT}[hf]'"
    from targets.executorch.target import _INSTALL
    assert _INSTALL == f"pip install '{ROOT}[executorch]'"


def test_a_misspelled_model_file_is_told_its_near_file_before_torch(ran):
    typo = _exporter_without_torch(ran, "build", "tests/models/statefull.py:export_differs")
    assert typo.returncode == 2, typo.stderr
    assert "did you mean 'stateful.py'?" in typo.stderr, typo.stderr
    assert "tests/models/stateful.py:export_differs" in typo.stderr and "Traceback" not in (
        typo.stderr)
    as_json = _exporter_without_torch(ran, "build", "tests/models/Stateful.py:f", "--json")
    assert as_json.returncode == 2, as_json.stderr
    assert "did you mean 'stateful.py'?" in json.loads(as_json.stdout)["error"]["what"]


_BACKENDS = ("torch", "onnxruntime", "onnx", "tvm", "executorch", "transformers", "torchao")


def _modules_after(ran, *args: str) -> set[str]:
    """The modules a console-script run of ``exporter ARGS`` has imported when it ends."""
    code = (f"import json, sys\nsys.argv = {['exporter', *args]!r}\n"
            "from exporter.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    done = ran(subprocess.run, [sys.executable, "-c", code], cwd=ROOT, capture_output=True,
               text=True, timeout=120, env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_help_lists_the_commands_without_importing_them_pydantic_or_any_target(ran):
    """`exporter --help` reads the command list alone: no command module (build's flags
    come from pydantic models of every target's options), no target, no backend."""
    loaded = _modules_after(ran, "--help")
    roots = {name.split(".")[0] for name in loaded}
    assert not roots & {*_BACKENDS, "pydantic", "targets", "passes", "plan", "numpy"}, roots
    commands = {name for name in loaded if name.startswith("exporter.")}
    assert commands <= {"exporter.cli", "exporter.cli.commands", "exporter.cli.common",
                        "exporter.cli.interrupts"}, commands
    # typer's boxed layout imports rich's markdown and traceback: most of the start-up
    assert not loaded & {"typer.rich_utils", "rich.markdown"}, loaded & {"typer.rich_utils"}


def test_exporter_alone_prints_the_command_list_and_exits_2(ran):
    alone = _exporter_without_torch(ran)
    assert alone.returncode == 2 and "Commands:" in alone.stdout, alone.stderr
    assert "build" in alone.stdout and "Traceback" not in alone.stderr


def test_build_help_reads_the_targets_cards_and_imports_no_backend(ran):
    loaded = _modules_after(ran, "build", "--help")
    roots = {name.split(".")[0] for name in loaded}
    assert not roots & set(_BACKENDS), roots
    implementations = {name for name in loaded if name.startswith("targets.")
                       and name.rsplit(".", 1)[1] in ("target", "cpu", "cuda", "lower")}
    assert not implementations, implementations
    assert "exporter.cli.artifact" not in loaded  # only the command that was named


def test_the_command_list_matches_each_commands_own_summary_and_module():
    """The list --help shows without importing the commands says what each command's
    docstring says, and names every command the app has, in its module."""
    import typer.main

    from exporter.cli import app
    from exporter.cli.commands import COMMANDS
    registered = {typer.main.get_command_name(info.callback.__name__): info.callback
                  for info in app.registered_commands}
    assert set(registered) == set(COMMANDS)
    for name, callback in registered.items():
        module, summary = COMMANDS[name]
        first = " ".join(callback.__doc__.split("\n\n")[0].split()).replace("`", "'")
        assert (callback.__module__, first) == (module, summary), name


def test_a_mistyped_command_is_told_its_near_name_without_importing_the_commands(ran):
    typo = _exporter_without_torch(ran, "bulid", "zoo:mlp")
    assert typo.returncode == 2 and "Did you mean 'build'?" in typo.stderr, typo.stderr


def test_inspect_of_a_cpu_artifact_says_it_needs_torch_without_importing_it(ran, mlp_build):
    """A compiled (aoti) artifact's summary names torch among its needs; knowing that
    takes no torch import (torch takes seconds to start)."""
    loaded = _modules_after(ran, "inspect", str(mlp_build.artifact))
    assert "torch" not in loaded
    summary = _exporter_without_torch(ran, "inspect", str(mlp_build.artifact))
    assert summary.returncode == 0, summary.stderr
    assert "target cpu" in summary.stdout and "native code (aoti)" in summary.stdout
    assert "runs without torch" not in summary.stdout


def test_a_ctrl_c_during_an_import_lands_once_the_import_is_done(tmp_path):
    """A KeyboardInterrupt raised inside an import (torch's, under load: its extension's
    initialisation) can abort the process; the CLI's handler waits for the import to end."""
    (tmp_path / "slow_module.py").write_text(
        "import time\ntime.sleep(1.5)\nprint('imported', flush=True)\n")
    script = (
        "import signal, sys, time\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "from exporter.cli import interrupts\n"
        "signal.signal(signal.SIGINT, interrupts.interrupt)\n"
        "print('ready', flush=True)\n"
        "try:\n"
        "    import slow_module\n"
        "    time.sleep(10)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted, module whole:', 'slow_module' in sys.modules, flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.3)  # inside the import's sleep
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out.splitlines() == ["imported", "interrupted, module whole: True"], out
