"""ExecuTorch artifacts in a native bundle (`exporter package --native`): Hugging Face
CNNs and BERT built for executorch at fp32 and int8, packed with the runner and only the
libraries it loads, run by the bundle's run.sh with no Python on PATH, and equal bit for
bit to the Python runtime's run of the same artifact (both run the same ExecuTorch kernels
and XNNPACK delegate from the same wheel, with the same thread pool). make test packs a
tiny RegNetY (depthwise convolutions, squeeze-excite, all in XNNPACK: a 5 s build);
MobileNetV2 (152 ops, a 23 CPU s build) and BERT run in make test-slow."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT

pytest.importorskip("executorch")
pytest.importorskip("transformers")

MOBILENET = "tests/models/hf_mobilenet.py:tiny_mobilenet_v2"
REGNET = "tests/models/hf_regnet.py:tiny_regnet_y"
BERT = "tests/models/hf_bert.py:tiny_bert"
# what run.sh uses; the test PATH holds these and no python
SHELL_TOOLS = ("sh", "sha256sum", "awk", "uname", "dirname", "basename", "ls", "cat")
WHEEL_LIBS = {"libexecutorch.so", "libexecutorch_threadpool.so",
              "libexecutorch_backend_xnnpack.so"}


def _inputs(spec: str, path: Path) -> Path:
    rng = np.random.default_rng(1)
    if spec in (MOBILENET, REGNET):
        arrays = {"pixel_values": rng.standard_normal((2, 3, 32, 32)).astype(np.float32)}
    else:
        arrays = {"input_ids": rng.integers(0, 128, (2, 12)).astype(np.int64),
                  "attention_mask": np.ones((2, 12), np.int64)}
    np.savez(path, **arrays)
    return path


@pytest.fixture(scope="session")
def et_artifact(tmp_path_factory, cli_here):
    """(spec, recipe) -> its validated executorch artifact, built once per session (in
    process: the bundle is under test here, not the build's command)."""
    built: dict[tuple[str, str], Path] = {}
    folder = tmp_path_factory.mktemp("et-native")

    def get(spec: str, recipe: str = "fp32") -> Path:
        if (spec, recipe) not in built:
            out = folder / f"{Path(spec.split(':')[0]).stem}-{recipe}.artifact"
            extra = [] if recipe == "fp32" else ["--quantize", recipe]
            if recipe == "int8-static":  # calibrated on the example (a random net's own)
                from tests.models.hf_mobilenet import tiny_mobilenet_v2
                calibration = folder / "calibration.npz"
                np.savez(calibration, pixel_values=tiny_mobilenet_v2()[1][0].numpy())
                extra += ["--calibration", str(calibration)]
            result = cli_here("build", spec, "--target", "executorch", "--out", str(out),
                              "--json", *extra)
            assert result.returncode == 0, result.stderr
            assert json.loads(result.stdout)["validation"]["passed"] is True
            built[spec, recipe] = out
        return built[spec, recipe]
    return get


@pytest.fixture(scope="session")
def no_python_path(tmp_path_factory) -> str:
    """A PATH with the shell tools run.sh uses and no python."""
    folder = tmp_path_factory.mktemp("no-python-bin")
    for tool in SHELL_TOOLS:
        os.symlink(shutil.which(tool), folder / tool)
    assert shutil.which("python3", path=str(folder)) is None
    return str(folder)


def _unpacked(cli, artifacts: list[Path], tmp: Path) -> tuple[Path, dict]:
    bundle = tmp / "device.tar.gz"
    result = cli("package", "--native", *map(str, artifacts), "--out", str(bundle), "--json")
    assert result.returncode == 0, result.stderr
    with tarfile.open(bundle) as tar:
        tar.extractall(tmp / "unpacked", filter="tar")
    return tmp / "unpacked" / "device", json.loads(result.stdout)


def _run_sh(folder: Path, artifact: str, inputs: Path, out: Path, path: str):
    return subprocess.run([str(folder / "run.sh"), artifact, "--inputs", str(inputs), "--out",
                           str(out)], env={"PATH": path}, capture_output=True, text=True,
                          timeout=300, check=False)


def _python_run(artifact: Path, inputs: Path, out: Path) -> dict[str, np.ndarray]:
    done = subprocess.run([sys.executable, "-m", "runtime", "run", str(artifact), "--inputs",
                           str(inputs), "--out", str(out), "--quiet"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    return dict(np.load(out))


def _check_native_equals_python(cli, artifacts: list[Path], spec: str, tmp: Path,
                                path: str) -> dict:
    folder, packed = _unpacked(cli, artifacts, tmp)
    inputs = _inputs(spec, tmp / "in.npz")
    for artifact in artifacts:
        native_out = tmp / f"{artifact.stem}-native.npz"
        done = _run_sh(folder, artifact.name, inputs, native_out, path)
        assert done.returncode == 0, done.stderr
        native = dict(np.load(native_out))
        python = _python_run(artifact, inputs, tmp / f"{artifact.stem}-python.npz")
        assert native.keys() == python.keys()
        for name, value in python.items():
            assert native[name].dtype == value.dtype and native[name].shape == value.shape
            assert np.array_equal(native[name], value), name
    return packed


def _shipped(folder: Path) -> set[str]:
    return {p.name for p in (folder / "lib").iterdir()}


def test_a_cnn_native_bundle_runs_without_python_equal_to_the_python_runtime(
        et_artifact, cli, tmp_path, no_python_path):
    artifact = et_artifact(REGNET)
    packed = _check_native_equals_python(cli, [artifact], REGNET, tmp_path, no_python_path)
    shipped = _shipped(tmp_path / "unpacked" / "device")
    # every op in XNNPACK: no kernel library, and never the device's C/C++ runtime
    assert WHEEL_LIBS <= shipped and not any("kernels" in name for name in shipped)
    assert not shipped & {"libc.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libm.so.6"}
    assert packed["backends"] == ["executorch"] and set(packed["libraries"]) == shipped


@pytest.mark.slow
@pytest.mark.parametrize("spec, recipe", [(MOBILENET, "fp32"), (MOBILENET, "int8-static"),
                                          (BERT, "fp32"), (BERT, "int8-dynamic")])
def test_hf_models_native_bundle_equals_the_python_runtime(et_artifact, cli, tmp_path,
                                                          no_python_path, spec, recipe):
    _check_native_equals_python(cli, [et_artifact(spec, recipe)], spec, tmp_path,
                                no_python_path)


@pytest.mark.slow
def test_a_program_calling_executorch_kernels_ships_that_library_and_refuses_without_it(
        et_artifact, cli, tmp_path):
    """BERT's layer norm, embedding and masking run on ExecuTorch's own kernels (not
    XNNPACK): the bundle ships the kernel library the runner opens for them, and a runner
    without that library refuses the artifact naming it (exit 2), never a crash. A fully
    delegated CNN ships none (the fast test)."""
    artifact = et_artifact(BERT)
    folder, packed = _unpacked(cli, [artifact], tmp_path)
    assert "libexecutorch_kernels_optimized.so" in packed["libraries"]
    assert "libexecutorch_kernels_quantized.so" not in packed["libraries"]
    (folder / "lib" / "libexecutorch_kernels_optimized.so").unlink()
    out = tmp_path / "no.npz"
    refused = subprocess.run([str(folder / "bin" / "edge-run"), str(artifact), "--inputs",
                              str(_inputs(BERT, tmp_path / "in.npz")), "--out", str(out)],
                             env={"LD_LIBRARY_PATH": str(folder / "lib")}, capture_output=True,
                             text=True, timeout=120, check=False)
    assert refused.returncode == 2 and "libexecutorch_kernels_optimized.so" in refused.stderr
    assert not out.exists()


def test_an_artifact_with_partitions_that_cannot_go_native_is_refused_naming_them(
        onnx_mlp, cli_here, tmp_path):
    out = tmp_path / "bundle.tar.gz"
    result = cli_here("package", "--native", str(onnx_mlp), "--out", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "partition 'p0' runs on onnxruntime" in result.stderr
    assert "executorch, tvm" in result.stderr and "--fallback forbid" in result.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []
    as_json = cli_here("package", "--native", str(onnx_mlp), "--out", str(out), "--json")
    assert as_json.returncode == 2 and json.loads(as_json.stdout)["error"]["exit_code"] == 2


@pytest.mark.parametrize("args", [["missing.artifact", "--out", "b.tar.gz"],
                                  ["{onnx}", "--out", "b.zip"],
                                  ["{onnx}", "--out", "no-such-dir/b.tar.gz"]],
                         ids=["missing-artifact", "not-a-tarball", "no-such-folder"])
def test_bad_native_package_input_is_a_usage_error_writing_nothing(onnx_mlp, cli_here,
                                                                   tmp_path, args):
    args = [a.replace("{onnx}", str(onnx_mlp)) for a in args]
    result = cli_here("package", "--native", *args, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "error:" in result.stderr and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("program", [b"", b"\x1c\x00\x00\x00ET12" * 40],
                         ids=["empty", "garbage"])
def test_a_pte_executorch_refuses_is_a_bad_artifact_for_the_native_runner_too(
        et_artifact, tmp_path, program):
    """A .pte whose hash matches a rebuilt manifest but that ExecuTorch's verifier refuses:
    exit 2 from edge-run with the Python loader's words, no output written."""
    import runtime
    from exporter.ship.archive_writer import write_artifact
    from exporter.ship.native_runner import build_runner
    from runtime.errors import ArtifactError
    from runtime.format.archive import ArtifactReader
    with ArtifactReader.open(et_artifact(REGNET)) as reader:
        manifest = json.loads(json.dumps(reader.manifest))
        entries = {n: reader.read_bytes(n) for n in reader.names() if n != "manifest.json"}
    (entry,) = [name for name in entries if name.endswith(".pte")]
    entries[entry] = program
    bad = write_artifact(tmp_path / "bad.artifact", manifest, entries)
    with pytest.raises(ArtifactError, match="ExecuTorch could not load partition 'p0'"):
        runtime.load(bad)
    out = tmp_path / "out.npz"
    done = subprocess.run([str(build_runner(None, frozenset({"executorch"}))), str(bad),
                           "--inputs", str(_inputs(REGNET, tmp_path / "in.npz")), "--out",
                           str(out), "--json"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 2 and not out.exists()
    assert "ExecuTorch could not load partition 'p0'" in json.loads(done.stdout)["error"]["message"]
