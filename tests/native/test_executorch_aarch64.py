"""ExecuTorch artifacts built for linux-aarch64 (`--platform linux-aarch64`), run by the
aarch64 native runner under qemu-user and judged against eager PyTorch by the gate the
build itself used (fp32: the float64-referenced tolerance; int8: the quantized gate)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.native import qemu
from tests.native.conftest import dynamic_paths, is_stripped

pytest.importorskip("executorch")
pytestmark = qemu.needs_qemu

PLATFORM = "linux-aarch64"


@pytest.fixture(scope="session")
def aarch64_et_runner() -> Path:
    from exporter.ship.native_runner import build_runner
    return build_runner(PLATFORM, frozenset({"executorch"}))  # cached in build/native/


@pytest.fixture(scope="session")
def aarch64_et_mlp(tmp_path_factory):
    """recipe ("fp32", "int8-dynamic") -> zoo:mlp built for executorch on linux-aarch64."""
    import exporter
    folder, built = tmp_path_factory.mktemp("et-aarch64"), {}

    def get(recipe: str):
        if recipe not in built:
            quantize = {} if recipe == "fp32" else {"quantize": recipe}
            # the test judges the aarch64 run itself: the build's x86 validation is not needed
            built[recipe] = exporter.build("zoo:mlp", target="executorch", platform=PLATFORM,
                                           out=folder / f"mlp-{recipe}.artifact",
                                           validate_artifact=False, **quantize)
        return built[recipe]
    return get


def mlp_inputs(batch: int = 3) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(7).standard_normal((batch, 64))
                            .astype(np.float32))


def run_in_qemu(runner: Path, artifact: Path, x: torch.Tensor, tmp: Path,
                lib_dirs=()) -> dict[str, torch.Tensor]:
    given, out = tmp / "in.npz", tmp / "out.npz"
    np.savez(given, x=x.numpy())
    done = qemu.run(runner, str(artifact), "--inputs", str(given), "--out", str(out),
                    lib_dirs=lib_dirs, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    with np.load(out) as got:
        return {name: torch.from_numpy(got[name]) for name in got.files}


def judged_against_eager(manifest, got: torch.Tensor, x: torch.Tensor) -> dict:
    """The gate the build recorded (its settings), applied to ``got`` against eager."""
    from exporter.model.zoo import make_mlp
    from exporter.validation.gates import QuantGate, Tolerance
    settings = manifest.build["settings"]
    gate = (QuantGate(settings["quant_min_sqnr_db"], settings["quant_min_cosine"],
                      settings["quantize"]) if settings.get("quantize")
            else Tolerance.for_dtype(settings["dtype"]))
    model = make_mlp()[0]
    with torch.no_grad():
        eager = model(x)
        reference = model.double()(x.double()) if gate.float64_reference else eager
    return gate.judge(got, reference, eager)


# int8 on executorch runs in make test on x86 (test_executorch_target.py)
@pytest.mark.parametrize("recipe", ["fp32", pytest.param("int8-dynamic", marks=pytest.mark.slow)])
def test_an_executorch_build_for_aarch64_runs_in_the_aarch64_runner_and_matches_eager(
        aarch64_et_runner, aarch64_et_mlp, recipe, tmp_path):
    built = aarch64_et_mlp(recipe)
    assert built.manifest.requirements.platform == PLATFORM
    x = mlp_inputs()
    got = run_in_qemu(aarch64_et_runner, built.artifact, x, tmp_path)
    verdict = judged_against_eager(built.manifest, got["output"], x)
    assert verdict["passed"], verdict


def test_a_bundle_for_aarch64_runs_its_runner_from_a_copied_folder_with_no_library_path(
        aarch64_et_runner, aarch64_et_mlp, tmp_path):
    """The bundled edge-run finds lib/ through its own RPATH ($ORIGIN/../lib, which also
    serves what lib/'s libraries need): no LD_LIBRARY_PATH, no build tree, no multiarch."""
    from exporter.ship.native_bundle import package_native
    built = aarch64_et_mlp("fp32")
    bundle = tmp_path / "device.tar.gz"
    package_native([built.artifact], bundle, PLATFORM)
    with tarfile.open(bundle) as tar:
        tar.extractall(tmp_path / "unpacked", filter="tar")
    folder = shutil.copytree(tmp_path / "unpacked" / "device", tmp_path / "elsewhere" / "device")
    shutil.rmtree(tmp_path / "unpacked")
    runner = folder / "bin" / "edge-run"
    assert dynamic_paths(runner) == {"RPATH": "$ORIGIN/../lib"}
    assert is_stripped(runner)
    x = mlp_inputs()
    np.savez(tmp_path / "in.npz", x=x.numpy())
    out = tmp_path / "out.npz"
    done = subprocess.run([qemu.QEMU, "-cpu", qemu.CPU, "-L", str(qemu.SYSROOT), "-E",
                           "EDGE_THREADS=1", str(runner), f"artifacts/{built.artifact.name}",
                           "--inputs", str(tmp_path / "in.npz"), "--out", str(out)],
                          cwd=folder, env={"PATH": os.environ["PATH"]}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (tmp_path / "tree").mkdir()
    from_build_tree = run_in_qemu(aarch64_et_runner, built.artifact, x, tmp_path / "tree")
    with np.load(out) as got:
        assert np.array_equal(got["output"], from_build_tree["output"].numpy())


class _Where(torch.nn.Module):
    def forward(self, x):
        return torch.where(x > 0, x, torch.tensor(-1.0))


def test_a_cpu_kernel_runs_on_the_calling_thread_with_edge_threads_1(aarch64_et_runner,
                                                                      tmp_path):
    """ExecuTorch 1.5's parallel_for (where.self_out) started its thread pool despite
    EDGE_THREADS=1, and under qemu-user those threads never start: the run hung (a SEW and
    a CANINE program did; native/src/backends/executorch_parallel.cc)."""
    import exporter
    x = mlp_inputs()
    built = exporter.build(_Where(), (x,), target="executorch", platform=PLATFORM,
                           out=tmp_path / "where.artifact", validate_artifact=False)
    assert "aten::where.self_out" in built.manifest.partitions[0].meta["kernels"]
    np.savez(tmp_path / "in.npz", x=x.numpy())
    done = qemu.run(aarch64_et_runner, str(built.artifact), "--inputs", str(tmp_path / "in.npz"),
                    "--out", str(tmp_path / "out.npz"), timeout=60)
    assert done.returncode == 0, done.stderr
    with np.load(tmp_path / "out.npz") as got:
        assert torch.equal(torch.from_numpy(got["output"]), _Where()(x))
