"""`exporter build --platform`: one list of names, refused before any work where unknown or
where the target compiles native code for this machine only."""

from __future__ import annotations

import json

import pytest

from exporter.settings import BuildSettings
from runtime.host.platforms import NAMES, host_platform
from targets import all_targets


def _error(result) -> dict:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)["error"]


def test_a_misspelt_platform_is_exit_2_with_the_list_and_a_guess(cli_here):
    error = _error(cli_here("build", "zoo:mlp", "--target", "onnx", "--platform", "linux-arm64",
                            "--json"))
    text = " ".join([error["message"], *error["details"]])
    assert "did you mean linux-aarch64?" in text and all(name in text for name in NAMES)


def test_a_host_only_target_is_refused_for_another_platform_naming_those_that_build(cli_here,
                                                                                    tmp_path):
    other = next(name for name in NAMES if name != host_platform())
    out = tmp_path / "never.artifact"
    error = _error(cli_here("build", "zoo:mlp", "--target", "cpu", "--platform", other, "--out",
                            str(out), "--json"))
    assert f"target 'cpu' cannot build for {other}" in error["message"]
    able = [t.name for t in all_targets().values() if t.packaging.builds_for(other)]
    assert {"onnx", "executorch"} <= set(able) and "cpu" not in able
    assert all(name in error["hint"] for name in able)
    assert error["stage"] is None and not out.exists()  # refused before loading the model


def test_the_platform_defaults_to_this_machine_and_comes_from_the_config(tmp_path):
    assert BuildSettings().platform == host_platform()
    assert BuildSettings(platform="linux-aarch64").options() is not None
    from exporter.config import config_file
    config = tmp_path / "exporter.toml"
    config.write_text('spec = "zoo:mlp"\ntarget = "onnx"\nplatform = "linux-aarch64"\n')
    _, merged = config_file.merge(None, {}, set(), config)
    assert BuildSettings(**merged).platform == "linux-aarch64"


def test_the_lowering_is_told_the_platform(tmp_path):
    from exporter.builder.lowering import lower_options
    settings = BuildSettings(target="onnx", platform="linux-aarch64")
    assert lower_options(settings, tmp_path / "x.artifact").platform == "linux-aarch64"


@pytest.mark.parametrize("target,portable", [("onnx", True), ("executorch", True),
                                             ("cpu", False), ("cuda", False)])
def test_portable_targets_build_for_every_platform_and_native_ones_for_the_host(target,
                                                                              portable):
    packaging = all_targets()[target].packaging
    assert packaging.builds_for(host_platform())
    assert all(packaging.builds_for(name) for name in NAMES) == portable
