"""``exporter build --config FILE`` / ``--save-config FILE``: a build replayed from a file."""

from __future__ import annotations

import json
import tomllib


def test_saved_config_replays_the_build_and_flags_win(cli, tmp_path):
    saved = tmp_path / "exporter.toml"
    first = cli("build", "zoo:encoder", "--target", "onnx", "--memory-budget", "64MB",
                "--dynamic", "input_ids:0=1..8", "--dynamic", "attention_mask:0=1..8",
                "--dry-run", "--json", "--save-config", str(saved))
    assert first.returncode == 0, first.stderr
    written = tomllib.loads(saved.read_text())
    print(saved.read_text())
    assert written["spec"] == "zoo:encoder" and written["target"] == "onnx"
    assert written["memory_budget"] == 64_000_000 and len(written["dynamic"]) == 2
    replay = cli("build", "--config", str(saved), "--dry-run", "--json")
    assert replay.returncode == 0, replay.stderr
    a, b = json.loads(first.stdout), json.loads(replay.stdout)
    assert (a["signature"], a["placement"]) == (b["signature"], b["placement"])
    override = cli("build", "--config", str(saved), "--target", "cpu", "--dry-run", "--json")
    assert json.loads(override.stdout)["target"] == "cpu"
    assert json.loads(override.stdout)["signature"] == a["signature"]  # the rest still applies


def test_bad_config_files_are_usage_errors(cli, tmp_path):
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('spec = "zoo:mlp"\ntargett = "cpu"\n')
    result = cli("build", "--config", str(unknown), "--dry-run")
    assert result.returncode == 2 and "--targett" in result.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text("spec = \n")
    result = cli("build", "--config", str(broken), "--dry-run")
    assert result.returncode == 2 and "not valid TOML" in result.stderr
    nospec = tmp_path / "nospec.toml"
    nospec.write_text('target = "cpu"\n')
    result = cli("build", "--config", str(nospec), "--dry-run")
    assert result.returncode == 2 and "no model spec given" in result.stderr
    for path in (unknown, broken, nospec):
        assert "Traceback" not in result.stderr
