"""What the loader checks follows what the artifact holds: ONNX (and .pte) programs load on
any platform, native code only on the platform and CPU it was compiled for."""

from __future__ import annotations

import json

import numpy as np
import pytest

import runtime
from exporter.builder.pipeline import foreign_native_code
from exporter.ship.archive_writer import write_artifact
from runtime.errors import CompatibilityError
from runtime.format import consistency
from runtime.format.archive import ArtifactReader
from runtime.format.manifest import Requirements
from runtime.host import platforms


def _rewrite(src, dst, change):
    with ArtifactReader.open(src) as reader:
        manifest = json.loads(json.dumps(reader.manifest))
        files = {name: reader.read_bytes(name) for name in reader.names()}
    change(manifest, files)
    return write_artifact(dst, manifest, files)


def _built_for(platform: str):
    def change(manifest, files):
        manifest["requirements"]["platform"] = platform
        manifest["requirements"]["arch"] = platforms.get_platform(platform).arch
    return change


def _as_tvm(platform: str):
    """The onnx artifact's partition turned into a TVM library (never opened: refused first)."""
    def change(manifest, files):
        _built_for(platform)(manifest, files)
        part = manifest["partitions"][0]
        part["backend"], part["files"] = "tvm", ["lib.so", "params.safetensors"]
        part["meta"] = {"library": "partitions/p0/lib.so",
                        "params": "partitions/p0/params.safetensors", "num_params": 0}
        files["partitions/p0/lib.so"] = b"\x7fELF not really"
        files["partitions/p0/params.safetensors"] = b"not read"
    return change


def _host_is(monkeypatch, name: str) -> None:
    monkeypatch.setattr(consistency, "host_platform", lambda: name)


def _runs(path) -> None:
    program = runtime.load(path)
    out = program(np.ones((2, 64), np.float32))
    assert tuple(out.shape) == (2, 10)


def test_an_onnx_artifact_built_on_x86_loads_on_an_aarch64_host(onnx_mlp, monkeypatch):
    assert runtime.read_manifest(onnx_mlp).requirements.platform_name == "linux-x86_64"
    _host_is(monkeypatch, "linux-aarch64")
    _runs(onnx_mlp)


def test_an_onnx_artifact_built_for_aarch64_loads_on_an_x86_host(onnx_mlp, tmp_path,
                                                                  monkeypatch):
    built = _rewrite(onnx_mlp, tmp_path / "a64.artifact", _built_for("linux-aarch64"))
    _host_is(monkeypatch, "linux-x86_64")
    _runs(built)


@pytest.mark.parametrize("built_for,host", [("linux-x86_64", "linux-aarch64"),
                                            ("linux-aarch64", "linux-x86_64")])
def test_native_code_for_another_platform_is_refused_naming_the_partition(
        onnx_mlp, tmp_path, monkeypatch, built_for, host):
    bad = _rewrite(onnx_mlp, tmp_path / "tvm.artifact", _as_tvm(built_for))
    _host_is(monkeypatch, host)
    with pytest.raises(CompatibilityError, match=f"built for {built_for} but this machine is "
                       f"{host}: partition 'p0' \\(tvm\\) holds native code") as caught:
        runtime.load(bad)
    assert f"--platform {host}" in caught.value.hint


def test_an_old_artifact_without_a_platform_is_judged_by_its_arch(onnx_mlp, tmp_path,
                                                                  monkeypatch):
    def old(manifest, files):
        _as_tvm("linux-x86_64")(manifest, files)
        del manifest["requirements"]["platform"]
    bad = _rewrite(onnx_mlp, tmp_path / "old.artifact", old)
    assert runtime.read_manifest(bad).requirements.platform_name == "linux-x86_64"
    _host_is(monkeypatch, "linux-aarch64")
    with pytest.raises(CompatibilityError, match="built for linux-x86_64"):
        runtime.load(bad)


def test_a_kind_that_does_not_declare_itself_portable_counts_as_native_code(onnx_mlp, tmp_path,
                                                                              monkeypatch):
    def unknown_kind(manifest, files):
        _built_for("linux-x86_64")(manifest, files)
        manifest["partitions"][0]["backend"] = "no-such-kind"
    bad = _rewrite(onnx_mlp, tmp_path / "unknown.artifact", unknown_kind)
    _host_is(monkeypatch, "linux-aarch64")
    with pytest.raises(CompatibilityError, match="'p0' \\(no-such-kind\\) holds native code"):
        runtime.load(bad)


def test_a_cross_built_native_artifact_says_why_it_was_not_validated(onnx_mlp, tmp_path,
                                                                      monkeypatch):
    """Its validation process cannot load it here; where its native runner cannot run it
    under qemu either, the build says why instead of failing."""
    from exporter.builder import pipeline
    cross = _rewrite(onnx_mlp, tmp_path / "cross.artifact", _as_tvm("linux-aarch64"))
    monkeypatch.setattr(pipeline, "host_platform", lambda: "linux-x86_64")
    monkeypatch.setattr(pipeline.native_cases, "why_not", lambda manifest: "no qemu here")
    why = foreign_native_code(runtime.read_manifest(cross))
    assert why and "p0" in why and "linux-aarch64" in why and "no qemu here" in why
    portable = _rewrite(onnx_mlp, tmp_path / "portable.artifact", _built_for("linux-aarch64"))
    assert foreign_native_code(runtime.read_manifest(portable)) is None


def test_platform_names_say_what_exists_and_guess_a_near_miss():
    assert platforms.unknown_platform("linux-aarch64") is None
    problem = platforms.unknown_platform("linux-arm64")
    assert "did you mean linux-aarch64?" in problem and "linux-x86_64" in problem
    with pytest.raises(ValueError, match="unknown platform 'windows-x86'"):
        platforms.get_platform("windows-x86")
    assert platforms.platform_name("arm64") == "linux-aarch64"


def test_requirements_round_trip_the_platform():
    parsed = Requirements.from_json({"arch": "aarch64", "torch": "2.13.0",
                                     "platform": "linux-aarch64"})
    assert parsed.platform_name == "linux-aarch64"
    assert Requirements.from_json(parsed.to_json()) == parsed


def _as_aoti_for_avx2(manifest, files):
    _built_for("linux-x86_64")(manifest, files)
    manifest["requirements"].update(cpu_isa="avx2", cpu_flags=["avx", "avx2", "fma"])
    part = manifest["partitions"][0]
    part["backend"], part["files"] = "aoti", ["model.pt2"]
    part["meta"] = {"package": "partitions/p0/model.pt2"}
    files["partitions/p0/model.pt2"] = b"never opened"


def test_inspect_says_where_an_artifact_loads_and_which_cpu_its_native_code_needs(
        onnx_mlp, tmp_path, cli_here):
    native = _rewrite(onnx_mlp, tmp_path / "aoti.artifact", _as_aoti_for_avx2)
    said = json.loads(cli_here("inspect", str(native), "--json").stdout)["loads_on"]
    assert said == {"any_platform": False, "platforms": ["linux-x86_64"],
                    "native_code": ["aoti"], "cpu_isa": "avx2",
                    "cpu_flags": ["avx", "avx2", "fma"], "cuda_capability": None}
    text = cli_here("inspect", str(native)).stdout
    assert "requires linux-x86_64 with avx2 (3 CPU flags; --cpu-isa to choose)" in text
    portable = json.loads(cli_here("inspect", str(onnx_mlp), "--json").stdout)["loads_on"]
    assert portable["any_platform"] and set(portable["platforms"]) == set(platforms.NAMES)
    assert "loads on any platform" in cli_here("inspect", str(onnx_mlp)).stdout
