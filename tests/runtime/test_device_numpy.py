"""A device without torch: artifacts whose partitions all run on ONNX Runtime (or TVM) load
and run on numpy arrays through the same runtime.load / program(...) / program.run and
`python -m runtime run`; one that needs torch says which partition and what to install.
The processes here block `import torch` (a meta-path finder), as a device lacks it."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._pytree import tree_leaves

import runtime
from runtime.format.archive import ArtifactReader
from runtime.program.array_program import _leaves
from exporter.ship.archive_writer import write_artifact
from runtime.format.dtypes import NAMES
from runtime.program.requires import packages, torch_reasons
from tests.helpers import assert_runs_on_numpy_without_torch, run_without_torch

pytest.importorskip("onnxruntime")


def _rewritten(src: Path, dst: Path, change) -> Path:
    with ArtifactReader.open(src) as reader:
        manifest = dict(reader.manifest)
        files = {name: reader.read_bytes(name) for name in reader.names()}
    change(manifest)
    write_artifact(dst, manifest, files)
    return dst


def test_onnx_artifact_runs_on_numpy_arrays_without_torch(onnx_mlp, ran, tmp_path):
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    assert_runs_on_numpy_without_torch(ran, onnx_mlp, x, tmp_path)


def test_runtime_cli_runs_without_torch_and_prints_readable_lines(onnx_mlp, ran, tmp_path):
    x = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    done = run_without_torch(ran, """
        import sys
        from runtime.__main__ import main
        sys.exit(main(sys.argv[1:]))
    """, "run", str(onnx_mlp), "--inputs", str(tmp_path / "in.npz"), "--out",
                          str(tmp_path / "out.npz"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "output: float32[5, 10]"
    # the providers and where the nodes run, as lines: no Python dict
    assert "p0: providers used: CPUExecutionProvider" in done.stderr
    assert "CPUExecutionProvider runs 5 node(s): Gemm x3, Relu x2" in done.stderr
    assert "{" not in done.stderr
    assert f"wrote the outputs to {tmp_path / 'out.npz'}" in done.stderr  # where run.sh put them
    with np.load(tmp_path / "out.npz") as out:
        expected = runtime.load(onnx_mlp)(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(out["output"], expected, rtol=1e-6, atol=1e-6)


def test_bad_numpy_inputs_are_named_without_torch(onnx_mlp, ran):
    done = run_without_torch(ran, """
        import sys
        import numpy as np
        import runtime
        program = runtime.load(sys.argv[1])
        for bad in (np.ones((3, 64)), np.ones((40, 64), np.float32), 1.0):
            try:
                program.run([bad])
            except runtime.InputMismatchError as exc:
                print(exc.details[0])
    """, str(onnx_mlp))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "input 'x': expected dtype float32, got float64",
        "input 'x' dim 0 (batch): 40 is outside the built range 1..32",
        "input 'x': expected a tensor, got float"]


@pytest.mark.parametrize("change, needle", [
    (lambda p: p.update(backend="aoti"), "partition 'p0' runs on aoti"),
    (lambda p: p.update(device="cuda"), "partition 'p0' runs on cuda"),
])
def test_artifact_that_needs_torch_names_the_partition_and_the_pip_command(
        onnx_mlp, ran, tmp_path, change, needle):
    needs = _rewritten(onnx_mlp, tmp_path / "needs-torch.artifact",
                       lambda m: change(m["partitions"][0]))
    np.savez(tmp_path / "in.npz", x=np.ones((2, 64), np.float32))
    done = run_without_torch(ran, """
        import sys
        from runtime.__main__ import main
        sys.exit(main(sys.argv[1:]))
    """, "run", str(needs), "--inputs", str(tmp_path / "in.npz"))
    assert done.returncode == 2, done.stderr
    torch_version = runtime.read_manifest(onnx_mlp).requirements.torch.split("+")[0]
    assert needle in done.stderr and f"pip install torch=={torch_version}" in done.stderr
    assert "needs torch, which is not installed" in done.stderr
    assert "Traceback" not in done.stderr


def test_with_torch_an_onnx_artifact_skips_the_torch_checks_and_takes_numpy(onnx_mlp, tmp_path):
    """The torch version and the GPU matter to torch partitions only; with torch
    installed the program still gives tensors, and takes numpy arrays too."""
    other = _rewritten(onnx_mlp, tmp_path / "other-torch.artifact",
                       lambda m: m["requirements"].update(torch="1.13.0"))
    program = runtime.load(other)
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    from_array, from_tensor = program(x), program(torch.from_numpy(x))
    assert isinstance(from_array, torch.Tensor) and torch.equal(from_array, from_tensor)
    assert torch.equal(program.run({"x": x})["output"], from_tensor)
    assert torch.equal(program.run([x])["output"], from_tensor)


def test_what_an_artifact_needs(onnx_mlp, tmp_path):
    onnx_only = runtime.read_manifest(onnx_mlp)
    assert torch_reasons(onnx_only) == [] and packages(onnx_only) == ("numpy",)
    bf16 = runtime.read_manifest(_rewritten(
        onnx_mlp, tmp_path / "bf16.artifact",
        lambda m: m["signature"]["inputs"][0].update(dtype="bfloat16")))
    assert torch_reasons(bf16) == ["'x' is bfloat16, which numpy does not hold"]
    assert packages(bf16) == ("torch", "numpy", "safetensors")
    tvm = runtime.read_manifest(_rewritten(
        onnx_mlp, tmp_path / "tvm.artifact", lambda m: m["partitions"][0].update(backend="tvm")))
    assert packages(tvm) == ("numpy", "safetensors")


def test_the_dtype_table_names_every_torch_dtype():
    torch_names = {str(v).removeprefix("torch.") for v in vars(torch).values()
                   if isinstance(v, torch.dtype)}
    assert NAMES == torch_names


Point = collections.namedtuple("Point", "a b")


@pytest.mark.parametrize("tree", [
    ((1, 2), {}),
    (([1, {"z": 2, "a": 3}],), {"k": Point(4, 5), "b": [6, (7,)]}),
    ((collections.OrderedDict(y=1, x=2), None), {}),
])
def test_array_leaves_follow_torch_pytree_order(tree):
    assert _leaves(tree) == tree_leaves(tree)


def test_a_new_executor_kind_that_declares_arrays_runs_without_torch(onnx_mlp, tmp_path):
    """Whether a kind runs on numpy arrays is its executor's to declare: registering one
    is enough, no second list of kinds to update."""
    from runtime.executors import register_executor, unregister_executor
    from runtime.executors.onnxruntime import OnnxRuntimeExecutor

    class Declared:
        Meta, load = OnnxRuntimeExecutor.Meta, OnnxRuntimeExecutor.load
        arrays, array_packages = True, ("scipy",)

    class Silent:
        Meta, load = OnnxRuntimeExecutor.Meta, OnnxRuntimeExecutor.load

    register_executor("declared-arrays", Declared)
    register_executor("declares-nothing", Silent)
    try:
        manifests = {kind: runtime.read_manifest(_rewritten(
            onnx_mlp, tmp_path / f"{kind}.artifact",
            lambda m, kind=kind: m["partitions"][0].update(backend=kind)))
            for kind in ("declared-arrays", "declares-nothing")}
        assert torch_reasons(manifests["declared-arrays"]) == []
        assert packages(manifests["declared-arrays"]) == ("numpy", "scipy")
        assert torch_reasons(manifests["declares-nothing"]) == [
            "partition 'p0' runs on declares-nothing"]
    finally:
        unregister_executor("declared-arrays")
        unregister_executor("declares-nothing")
