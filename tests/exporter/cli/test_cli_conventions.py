"""CLI conventions a newcomer meets first (compare uv, ruff, huggingface-cli): no raw
markup in a pipe, -h and --version, flags without a type column, choices that wrap
instead of being cut, a did-you-mean for a mistyped target, and bad inputs refused
before anything compiles."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.conftest import ROOT, _record


def _piped(*args: str, columns: str | None = "80") -> subprocess.CompletedProcess:
    """The CLI with stdout a pipe (as in `exporter doctor | less`), at a given width
    (None: no COLUMNS, as in a plain pipe)."""
    _record(["exporter", *args])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": columns}
    if columns is None:
        del env["COLUMNS"]
    return subprocess.run([sys.executable, "-m", "exporter", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=300)


@pytest.mark.parametrize("command", ["doctor", "targets"])
def test_first_commands_print_no_markup_through_a_pipe(command):
    result = _piped(command)
    assert result.returncode == 0, result.stderr
    assert "[green]" not in result.stdout and "[/" not in result.stdout
    assert "[red]" not in result.stdout and "[yellow]" not in result.stdout
    assert "…" not in result.stdout  # a long word folds at 80 columns, never cut


def test_a_piped_table_keeps_each_row_on_one_line():
    """`exporter targets | grep onnx` finds the whole row."""
    rows = _piped("targets", columns=None).stdout.splitlines()
    onnx = [row for row in rows if row.startswith(" onnx ")]
    assert len(onnx) == 1 and "providers here: " in onnx[0] and "int8-static" in onnx[0]
    from targets.registry import BUILTIN  # this process may have registered test targets
    assert len(rows) == 2 + len(BUILTIN)  # header, rule, one line per target


def test_version_and_short_help():
    version = _piped("--version")
    assert version.returncode == 0 and version.stdout.startswith("exporter ")
    assert torch.__version__ in version.stdout
    helped = _piped("build", "-h")
    assert helped.returncode == 0 and "Usage:" in helped.stdout
    usage = _piped("run", "--help").stdout
    assert "exporter run [OPTIONS] ARTIFACT" in usage and "{" not in usage  # not {ARTIFACT}


def test_build_help_groups_flags_shows_no_bool_type_and_keeps_choices_whole():
    text = _piped("build", "--help").stdout
    panels = ("Model ", "Target ", "Target options", "Quantization", "Validation", "Output")
    at = [text.find(f"─ {panel}") for panel in panels]
    assert -1 not in at and at == sorted(at), at  # all there, in the README's order
    assert "<bool>" not in text  # flags take no value: no type column (--help's row too)
    assert "int4-weight" in text and "image-classification" in text  # not cut with "…"
    assert "tvm: MetaSchedule trials" in text  # a target's option, from its Options model
    assert "`" not in text and "<list[str]>" not in text  # rich would print them as is


def test_the_command_list_gives_each_command_one_unbroken_summary():
    """click wraps a summary at the list's width only: a line that ends while the next
    word would still have fitted (within the longest line) is a docstring's own line
    break showing through."""
    text = _piped("--help").stdout
    rows = [line for line in text.split("Commands:\n", 1)[1].splitlines() if line.strip()]
    start = rows[0].index(rows[0].split()[1])  # the summaries' column
    width = max(len(row) for row in rows) - start
    early = [(a.strip(), b.strip()) for a, b in zip(rows, rows[1:])
             if not b[:start].strip() and b.strip()  # b continues a's summary
             and len(a[start:].rstrip()) + 1 + len(b.split()[0]) < width]
    assert not early, early
    assert "`" not in text


def test_a_mistyped_target_gets_a_did_you_mean(cli_here):
    result = cli_here("build", "zoo:mlp", "--target", "onx", "--dry-run")
    assert result.returncode == 2 and "did you mean 'onnx'" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_option_of_another_target_is_refused_naming_its_target(cli_here):
    result = cli_here("build", "zoo:mlp", "--target", "cpu", "--tune", "4", "--dry-run")
    assert result.returncode == 2 and "--tune: is an option of target tvm" in result.stderr


def test_inputs_with_wrong_keys_are_refused_before_compiling(cli_here, tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, not_x=np.zeros((2, 64), np.float32))
    result = cli_here("build", "zoo:mlp", "--inputs", str(bad), "--out",
                      str(tmp_path / "a.artifact"))
    assert result.returncode == 2 and "does not hold the model's inputs" in result.stderr
    assert "unexpected 'not_x'" in result.stderr
    assert not (tmp_path / "a.artifact").exists()
    # the stages that ran (the Python API's progress events): capture, and nothing after it
    import exporter
    from exporter.errors import UserInputError
    started = []
    with pytest.raises(UserInputError, match="does not hold the model's inputs"):
        exporter.build("zoo:mlp", inputs=str(bad), out=str(tmp_path / "b.artifact"),
                       progress=lambda event: started.append(event.stage))
    assert any(s.startswith("capture") for s in started)
    assert not any(s.startswith(("passes", "partition", "lower", "validate")) for s in started)


def test_a_numpy_array_passed_to_a_program_is_taken_as_a_tensor(mlp_build):
    """Numpy arrays are taken (sharing memory); the outputs stay tensors; a wrong dtype is
    named as for a tensor."""
    import runtime
    import torch
    program = runtime.load(mlp_build.artifact)
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    got = program(x)
    assert isinstance(got, torch.Tensor) and torch.equal(got, program(torch.from_numpy(x)))
    with pytest.raises(runtime.InputMismatchError, match="expected dtype float32, got float64"):
        program(np.zeros((2, 64)))


def test_validate_against_another_model_is_a_usage_error(onnx_mlp, tmp_path):
    """Inputs that fit but outputs that do not: the wrong spec, not a broken artifact."""
    import exporter
    from exporter.errors import UserInputError
    other = tmp_path / "other.py"
    other.write_text("import torch\n\ndef make():\n    return torch.nn.Linear(64, 3), "
                     "(torch.randn(2, 64),)\n")
    with pytest.raises(UserInputError) as info:
        exporter.validate(onnx_mlp, f"{other}:make")
    text = str(info.value)
    assert "built from another model" in text and "output 'output'" in text
    assert "float32[2, 3]" in text and "compiler" not in text


def test_artifact_and_program_print_one_useful_line(onnx_mlp):
    import runtime
    from exporter.builder.pipeline import BuildResult
    program = repr(runtime.load(onnx_mlp))
    assert program.startswith(f"<Program {str(onnx_mlp)!r} target=onnx inputs=[x: float32[")
    assert "partitions=[onnxruntime@cpu x1]" in program and "\n" not in program
    artifact = repr(BuildResult(onnx_mlp, runtime.read_manifest(onnx_mlp)))
    assert "validation=passed" in artifact and "outputs=[output: float32[" in artifact
    assert len(artifact) < 300  # not the whole manifest


def test_a_reader_that_goes_away_stops_the_command_quietly():
    """`exporter doctor | head -0`: no 'sys.exit' error blamed on a model, no traceback."""
    _record(["exporter", "doctor", "|", "head", "-0"])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "doctor"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # before the command has written anything (its imports take seconds)
    stderr = proc.stderr.read()
    assert proc.wait(timeout=300) == 141, stderr
    assert stderr.strip() == "", stderr
