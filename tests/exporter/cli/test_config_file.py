"""``exporter build --config FILE`` / ``--save-config FILE``: a build replayed from a file."""

from __future__ import annotations

import json
import tomllib


def test_saved_config_replays_the_build_and_flags_win(cli_here, tmp_path):
    saved = tmp_path / "exporter.toml"
    first = cli_here("build", "zoo:encoder", "--target", "onnx", "--memory-budget", "64MB",
                     "--dynamic", "input_ids:0=1..8", "--dynamic", "attention_mask:0=1..8",
                     "--dry-run", "--json", "--save-config", str(saved))
    assert first.returncode == 0, first.stderr
    written = tomllib.loads(saved.read_text())
    assert written["spec"] == "zoo:encoder" and written["target"] == "onnx"
    assert written["memory_budget"] == 64_000_000 and len(written["dynamic"]) == 2
    flags = _build_flags()
    for key in set(written) - {"spec", "spec_sha256", "onnx"}:  # a key reads as its flag
        assert f"--{key.replace('_', '-')}" in flags, key
    # an option left at its default (None: the recipe decides) is not written
    assert set(written["onnx"]) == {"ep", "own_kernels"}
    assert {"--ep", "--quant-block", "--own-kernels", "--no-own-kernels"} <= flags
    replay = cli_here("build", "--config", str(saved), "--dry-run", "--json")
    assert replay.returncode == 0, replay.stderr
    a, b = json.loads(first.stdout), json.loads(replay.stdout)
    assert (a["signature"], a["placement"]) == (b["signature"], b["placement"])
    override = cli_here("build", "--config", str(saved), "--target", "cpu", "--dry-run", "--json")
    assert json.loads(override.stdout)["target"] == "cpu"
    assert json.loads(override.stdout)["signature"] == a["signature"]  # the rest still applies


def test_bad_config_files_are_usage_errors(cli_here, tmp_path):
    cases = {"unknown.toml": ('spec = "zoo:mlp"\ntargett = "cpu"\n', "--targett"),
             "broken.toml": ("spec = \n", "not valid TOML"),
             "nospec.toml": ('target = "cpu"\n', "no model spec given")}
    for name, (text, said) in cases.items():
        (tmp_path / name).write_text(text)
        result = cli_here("build", "--config", str(tmp_path / name), "--dry-run")
        assert result.returncode == 2 and said in result.stderr, (name, result.stderr)
        assert "Traceback" not in result.stderr, name


MODEL = '''
import torch
def make():
    return torch.nn.Linear(4, {width}), (torch.randn(1, 4),)
'''


def test_relative_spec_replays_the_same_model_from_anywhere(cli_here, tmp_path):
    """The saved spec is relative to the config file, with the source's
    hash; a replay from another directory builds the same file, a changed file is refused."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "model.py").write_text(MODEL.format(width=3))
    decoy = tmp_path / "elsewhere"
    decoy.mkdir()
    (decoy / "model.py").write_text(MODEL.format(width=5))  # same relative name, other model
    saved = project / "build.toml"
    first = cli_here("build", "model.py:make", "--target", "onnx", "--dry-run", "--json",
                     "--save-config", str(saved), cwd=project)
    assert first.returncode == 0, first.stderr
    written = tomllib.loads(saved.read_text())
    assert written["spec"] == "model.py:make" and len(written["spec_sha256"]) == 64
    replay = cli_here("build", "--config", str(saved), "--dry-run", "--json", cwd=decoy)
    assert replay.returncode == 0, replay.stderr
    shapes = [o["shape"] for o in json.loads(replay.stdout)["signature"]["outputs"]]
    assert shapes == [[1, 3]], "built project/model.py, not the one in the current directory"
    (project / "model.py").write_text(MODEL.format(width=7))
    changed = cli_here("build", "--config", str(saved), "--dry-run", cwd=decoy)
    assert changed.returncode == 2 and "changed since the config was saved" in changed.stderr
    assert "Traceback" not in changed.stderr


def test_validation_timeout_is_checked_and_applied(cli_here, tmp_path):
    """NaN is refused (exit 2); a value is what the build waits."""
    nan = tmp_path / "nan.toml"
    nan.write_text('spec = "zoo:mlp"\ntarget = "onnx"\nvalidation_timeout_s = nan\n')
    result = cli_here("build", "--config", str(nan), "--out", str(tmp_path / "a.artifact"))
    assert result.returncode == 2 and "validation" in result.stderr, result.stderr
    short = tmp_path / "short.toml"
    short.write_text('spec = "zoo:mlp"\ntarget = "onnx"\nvalidation_timeout_s = 0.01\n')
    result = cli_here("build", "--config", str(short), "--out", str(tmp_path / "b.artifact"))
    assert result.returncode == 3 and "in 0.01 s" in result.stderr
    assert "validation_timeout_s" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "b.artifact").exists()


def _build_flags() -> set[str]:
    """Every long flag of `exporter build`, as click parses them."""
    import typer.main

    from exporter.cli import app
    build = typer.main.get_command(app).commands["build"]
    return {flag for param in build.params for flag in [*param.opts, *param.secondary_opts]}
