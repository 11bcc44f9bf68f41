"""The native runner's tvm backend: the Python runtime's outputs bit for bit on x86, the
same refusals for weights and libraries, and cross builds for linux-aarch64 run by the
aarch64 runner under qemu-user, within the validation allowance of eager."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import ROOT
from tests.native import cases, qemu
from tests.native.conftest import native_refusal, python_refusal, run_native

MODELS = ROOT / "tests" / "models" / "edge_models.py"
PARAMS = "partitions/p0/params.safetensors"
LIBRARY = "partitions/p0/model.so"
# the validation's own allowance: eager at float32's error to float64, times 10, plus a floor
FACTOR, FLOOR = 10.0, 1e-6


def _python_outputs(artifact: Path, inputs: Path) -> dict[str, np.ndarray]:
    import runtime
    with np.load(inputs) as given:
        feed = {name: torch.from_numpy(given[name]) for name in given.files}
    return {k: v.numpy() for k, v in runtime.load(artifact).run(feed, output_device="cpu").items()}


def _replaced(good: Path, out: Path, name: str, data: bytes) -> Path:
    """The good artifact with one entry's bytes replaced and its record rehashed: only the
    backend's own checks stand between it and the runner."""
    def rehash(manifest):
        manifest["entries"][name] = cases.record(data)
    return cases.rebuilt(good, out, rehash, replace={name: data})


def _weights_with_header(good: Path, change) -> bytes:
    data = dict((i.filename, d) for i, d in cases.read(good))[PARAMS]
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    change(header)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data[8 + length:]


def test_native_tvm_gives_the_python_runtimes_outputs_bit_for_bit(edge_run, native_mlp,
                                                                   mlp_inputs, tmp_path):
    out = tmp_path / "out.npz"
    done = run_native(edge_run, native_mlp, mlp_inputs, out)
    assert done.returncode == 0, done.stderr
    expected = _python_outputs(native_mlp, mlp_inputs)
    with np.load(out) as got:
        assert set(got.files) == set(expected)
        for name, want in expected.items():
            assert got[name].dtype == want.dtype and np.array_equal(got[name], want), name


def test_weights_whose_shape_differs_from_the_manifest_are_refused_naming_the_tensor(
        edge_run, native_mlp, mlp_inputs, tmp_path):
    def reshape(header):  # same bytes, another shape: only the index comparison sees it
        header["p00000"]["shape"] = [2, 64]
    bad = _replaced(native_mlp, tmp_path / "bad.artifact", PARAMS,
                    _weights_with_header(native_mlp, reshape))
    native = native_refusal(edge_run, bad, mlp_inputs, tmp_path / "out.npz")
    assert native.exit_code == python_refusal(bad).exit_code == 2
    assert "'p00000'" in native.message and "manifest" in native.message


def test_weights_whose_byte_ranges_overlap_are_refused(edge_run, native_mlp, mlp_inputs,
                                                       tmp_path):
    def overlap(header):
        header["p00001"]["data_offsets"] = header["p00000"]["data_offsets"]
    bad = _replaced(native_mlp, tmp_path / "bad.artifact", PARAMS,
                    _weights_with_header(native_mlp, overlap))
    native = native_refusal(edge_run, bad, mlp_inputs, tmp_path / "out.npz")
    assert native.exit_code == python_refusal(bad).exit_code == 2
    assert "not a valid safetensors file" in native.message


def test_a_library_tvm_cannot_load_is_refused_as_a_bad_artifact(edge_run, native_mlp,
                                                                mlp_inputs, tmp_path):
    bad = _replaced(native_mlp, tmp_path / "bad.artifact", LIBRARY, b"\x7fELF not really")
    native = native_refusal(edge_run, bad, mlp_inputs, tmp_path / "out.npz")
    assert native.exit_code == python_refusal(bad).exit_code == 2
    assert "TVM could not load partition 'p0'" in native.message


# --- linux-aarch64: built here, run by the aarch64 runner under qemu-user -------------------

def _cross_build(tmp_path_factory, spec: str, name: str):
    import exporter
    out = tmp_path_factory.mktemp("tvm-aarch64") / f"{name}.artifact"
    return exporter.build(spec, target="tvm", platform="linux-aarch64", fallback="forbid",
                          out=out)


def test_a_normal_native_tvm_run_says_nothing_on_stderr(edge_run, native_mlp, mlp_inputs,
                                                       tmp_path):
    """TVM logs each memory scope of the VM it loads as a warning; a run that went well
    prints nothing but its --json result."""
    done = run_native(edge_run, native_mlp, mlp_inputs, tmp_path / "out.npz")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert json.loads(done.stdout)


@pytest.fixture(scope="session")
def aarch64_mlp(tmp_path_factory):
    if qemu.missing():
        pytest.skip(qemu.missing())
    return _cross_build(tmp_path_factory, "zoo:mlp", "mlp")


@pytest.fixture(scope="session")
def aarch64_runner():
    if qemu.missing():
        pytest.skip(qemu.missing())
    from exporter.ship.native_runner import build_runner
    return build_runner("linux-aarch64", frozenset({"tvm"}))


def _run_under_qemu(runner: Path, artifact: Path, inputs: dict, tmp_path: Path) -> dict:
    given, out = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(given, **{k: v.numpy() for k, v in inputs.items()})
    done = qemu.run(runner, str(artifact), "--inputs", str(given), "--out", str(out),
                    timeout=600)  # single-threaded in the guest: qemu.GUEST_ENV
    assert done.returncode == 0, done.stdout + done.stderr
    with np.load(out) as got:
        return {name: got[name] for name in got.files}


def _within_allowance(got: np.ndarray, model, args) -> None:
    """|got - eager64| <= FACTOR x |eager32 - eager64| + FLOOR x max(1, |eager64|)."""
    import copy
    with torch.no_grad():
        eager32 = model(*args).numpy()
        model64 = copy.deepcopy(model).double()
        eager64 = model64(*[a.double() if a.is_floating_point() else a for a in args]).numpy()
    allowance = FACTOR * np.abs(eager32 - eager64).max() + FLOOR * max(1.0, np.abs(eager64).max())
    assert np.abs(got - eager64).max() <= allowance


def test_an_aarch64_tvm_build_is_validated_under_qemu_and_records_its_platform(aarch64_mlp):
    manifest = aarch64_mlp.manifest
    assert manifest.requirements.platform == "linux-aarch64"
    assert manifest.validation["passed"] is True
    assert "qemu" in manifest.validation["runner"]
    meta = manifest.partitions[0].meta
    assert meta["platform"] == "linux-aarch64" and "aarch64" in meta["tvm_target"]


def test_the_aarch64_runner_gives_the_x86_runners_outputs(aarch64_mlp, aarch64_runner,
                                                         edge_run, native_mlp, mlp_inputs,
                                                         tmp_path):
    with np.load(mlp_inputs) as given:
        inputs = {name: torch.from_numpy(given[name]) for name in given.files}
    arm = _run_under_qemu(aarch64_runner, aarch64_mlp.artifact, inputs, tmp_path)
    x86 = _python_outputs(native_mlp, mlp_inputs)
    for name, want in x86.items():  # same schedules, other ISA: float rounding may differ
        np.testing.assert_allclose(arm[name], want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("factory", ["mobilenet_v2", "bert", "llama_forward"])
def test_edge_models_built_for_aarch64_match_eager_under_qemu(factory, aarch64_runner,
                                                              tmp_path_factory, tmp_path):
    from tests.models import edge_models
    model, args = getattr(edge_models, factory)()
    built = _cross_build(tmp_path_factory, f"{MODELS}:{factory}", factory)
    assert built.manifest.validation["passed"] is True
    names = [spec.name for spec in built.manifest.signature.inputs]
    got = _run_under_qemu(aarch64_runner, built.artifact, dict(zip(names, args)), tmp_path)
    output = built.manifest.signature.outputs[0].name
    _within_allowance(got[output], model, args)
