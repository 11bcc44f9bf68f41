"""The cuda target on a real GPU: build, load, CUDA-graph replay, dynamic shapes, dtypes,
validation and the bad cases. Skipped where no GPU exists (CI); run with `make test-gpu`."""

from __future__ import annotations

import json

import pytest
import torch

import runtime
from exporter.model.zoo import ZOO
from runtime.errors import CompatibilityError

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="session")
def cuda_builds(artifacts_dir, cli):
    """zoo:mlp fp32 (dynamic batch) and zoo:encoder bf16, built once."""
    builds = {}
    for name, dtype in (("mlp", "fp32"), ("encoder", "bf16")):
        out = artifacts_dir / f"{name}-cuda-{dtype}.artifact"
        result = cli("build", f"zoo:{name}", "--target", "cuda", "--dtype", dtype,
                     "--out", str(out), "--json")
        builds[name] = (out, result)
    return builds


@pytest.mark.parametrize("name", ["mlp", "encoder"])
def test_cuda_build_validates_and_records_the_gpu(cuda_builds, name):
    out, result = cuda_builds[name]
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["validation"]["passed"] is True
    manifest = runtime.read_manifest(out)
    major, minor = torch.cuda.get_device_capability()
    assert manifest.requirements.cuda_capability == f"{major}.{minor}"
    assert manifest.requirements.cuda == torch.version.cuda
    assert manifest.partitions[0].device == "cuda"
    assert data["measured"]["memory"]["cuda_peak_bytes"] > 0


def _expected(name, *args):
    module, _, _ = ZOO[name]()
    with torch.no_grad():
        return module(*[a.cpu() for a in args])


def test_graph_replay_matches_eager_and_returns_fresh_outputs(cuda_builds):
    out, _ = cuda_builds["mlp"]
    program = runtime.load(out)
    x = torch.randn(4, 64)
    first = program(x)  # CPU in, CPU out
    assert first.device.type == "cpu"
    torch.testing.assert_close(first, _expected("mlp", x), rtol=1e-3, atol=1e-3)
    second = program(torch.randn(4, 64))
    assert not torch.equal(first, second), "outputs must not alias the graph's buffers"
    gpu_out = program(x.cuda())  # GPU in, GPU out
    assert gpu_out.device.type == "cuda"
    torch.testing.assert_close(gpu_out.cpu(), first)


def test_dynamic_shapes_replay_one_graph_per_shape_with_a_bound(cuda_builds):
    out, _ = cuda_builds["mlp"]
    program = runtime.load(out, max_graphs=2)
    replay = program.executors[0]
    for batch in (1, 8, 32, 8):
        x = torch.randn(batch, 64)
        torch.testing.assert_close(program(x), _expected("mlp", x), rtol=1e-3, atol=1e-3)
    assert len(replay.graphs) == 2 and list(replay.graphs)[-1] == ((8, 64),)


def test_static_outputs_on_request_and_graphs_off(cuda_builds):
    out, _ = cuda_builds["mlp"]
    static = runtime.load(out, static_outputs=True)
    x = torch.randn(2, 64, device="cuda")
    a = static.run([x])["output"]
    b = static.run([x * 2])["output"]
    assert a.data_ptr() == b.data_ptr(), "static outputs are the graph's own buffer"
    plain = runtime.load(out, cuda_graphs=False)
    torch.testing.assert_close(plain(x).cpu(), _expected("mlp", x), rtol=1e-3, atol=1e-3)


def test_half_precision_builds_match_eager_loosely(cuda_builds):
    out, _ = cuda_builds["encoder"]
    module, args, _ = ZOO["encoder"]()
    got = runtime.load(out)(*args)
    expected = module(*args)
    for key in expected:
        assert got[key].dtype == torch.float32
        torch.testing.assert_close(got[key], expected[key], rtol=0.05, atol=0.05)


def test_artifact_for_a_newer_gpu_is_refused(cuda_builds, tmp_path):
    from tests.exporter.cli.test_bad_inputs import _rewrite_manifest
    out, _ = cuda_builds["mlp"]
    bad = tmp_path / "future-gpu.artifact"
    _rewrite_manifest(out, bad, lambda m: m["requirements"].update(cuda_capability="99.0"))
    with pytest.raises(CompatibilityError, match=r"99\.0.*has \d+\.\d+"):
        runtime.load(bad)


def test_bench_on_gpu_uses_cuda_events(cuda_builds, cli, tmp_path):
    out, _ = cuda_builds["mlp"]
    result = cli("bench", str(out), "--runs", "100", "--compile", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["timer"] == "cuda-events" and data["cuda_graphs"] is True
    assert set(data["timings"]) == {"artifact", "eager", "compile"}
    # the report of a GPU artifact: its partition in the GPU shade, the GPU timings as bars
    (tmp_path / "bench.json").write_text(result.stdout)
    page = tmp_path / "report.html"
    shown = cli("report", str(out), "--html", str(page), "--bench", str(tmp_path / "bench.json"))
    assert shown.returncode == 0, shown.stderr
    from exporter.report.charts import placement_colour
    text = page.read_text()
    assert placement_colour("aoti", "cuda") in text and text.count('class="bar"') == 3
    assert "cuda-events" in text


def test_the_lock_pins_the_cuda_torch_build(cuda_builds):
    """A bundle's lock names the CUDA torch the artifact was built with, and PyTorch's
    index for it (pip finds +cuNNN builds nowhere else)."""
    from exporter.ship.lock import lock_for
    out, _ = cuda_builds["mlp"]
    lock = lock_for([(out.name, runtime.read_manifest(out))]).lines()
    assert f"torch=={torch.__version__}" in lock, lock
    if "+cu" in torch.__version__:
        assert any(line.startswith("--extra-index-url") for line in lock)


def test_package_locks_the_cuda_torch_build(cuda_builds, cli, tmp_path):
    """``exporter package`` downloads the lock's wheels: only where the indexes answer
    (the GPU machine reaches none)."""
    import socket
    try:
        socket.getaddrinfo("download.pytorch.org", 443)
    except OSError:
        pytest.skip("download.pytorch.org cannot be reached from here")
    out, _ = cuda_builds["mlp"]
    result = cli("package", str(out), "--out", str(tmp_path / "gpu.tar.gz"), "--json")
    assert result.returncode == 0, result.stderr
    lock = json.loads(result.stdout)["lock"]
    assert f"torch=={torch.__version__}" in lock, lock
    if "+cu" in torch.__version__:  # pip needs PyTorch's index for a CUDA build
        assert any(line.startswith("--extra-index-url") for line in lock)


def test_static_libstdcxx_compiler_is_detected_here():
    """On the GPU machine the image's CXX links libstdc++ statically: say so, switch."""
    from targets.toolchain import choose_cxx
    assert choose_cxx().compiler is not None


@pytest.mark.parametrize("recipe,int4_rows", [("int8-weight", False), ("int4-weight", False),
                                               ("int4-weight", True)])  # False: tinygemm
def test_weight_only_recipes_on_the_gpu(artifacts_dir, cli, monkeypatch, recipe, int4_rows):
    """Weight-only (int8: torchao's rows; int4: our int4 rows, or with
    EDGE_EXPORTER_INT4_ROWS=0 torchao's tinygemm): every linear of a decoder and its tied output
    projection (x @ table.T) quantized, and the token table as int8 rows; smaller weights,
    the gate passed, and the loaded artifact (CUDA graphs) agrees with eager float32 at a
    new batch size."""
    pytest.importorskip("torchao")
    monkeypatch.setenv("EDGE_EXPORTER_INT4_ROWS", "1" if int4_rows else "0")
    from exporter.validation.gates import compare_quantized
    from exporter.report.console import quantization_records
    from tests.models.wide_decoder import VOCAB, wide_decoder

    out = artifacts_dir / f"decoder-cuda-{recipe}{'-rows' if int4_rows else ''}.artifact"
    result = cli("build", "tests/models/wide_decoder.py:wide_decoder", "--target", "cuda",
                 "--quantize", recipe, "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    manifest = runtime.read_manifest(out)
    (info,) = quantization_records(manifest)
    module, (ids,) = wide_decoder()
    linears = sum(isinstance(m, torch.nn.Linear) for m in module.modules())
    assert len(info["layers_quantized"]) == linears + 1 + 1  # + the head, + the table
    # float32 weights: int8 rows a quarter, int4 rows (kernels/int4_rows.py) about a sixth;
    # tinygemm's layout pads in_features to 1024: at hidden 128 it saves little
    smaller = 1.0 if recipe == "int4-weight" and not int4_rows else 2.5
    assert info["weight_bytes_after"] * smaller < info["weight_bytes_before"]
    assert manifest.validation["passed"]
    batch = torch.randint(0, VOCAB, ids.shape)  # new values (the spec's shapes are static)
    with torch.no_grad():
        row = compare_quantized(runtime.load(out)(batch.cuda()).cpu(), module(batch), 20, 0.99)
    assert row["passed"]


def test_int4_takes_smaller_groups_on_narrow_layers(cli, tmp_path):
    """The zoo decoder's hidden 64 is narrower than int4's group of 128: those layers
    are quantized in groups of 64 instead of being skipped (its table as int8 rows)."""
    pytest.importorskip("torchao")
    from exporter.report.console import quantization_records

    out = tmp_path / "decoder-int4.artifact"
    result = cli("build", "zoo:decoder", "--target", "cuda", "--quantize", "int4-weight",
                 "--out", str(out))
    assert result.returncode == 0, result.stderr
    (info,) = quantization_records(runtime.read_manifest(out))
    linears = sum(isinstance(m, torch.nn.Linear) for m in ZOO["decoder"]()[0].modules())
    # + the tied output projection (int4), + the token table (int8 rows)
    assert len(info["layers_quantized"]) == linears + 1 + 1
    assert info["layers_float"] == []


def test_handoffs_between_gpu_and_cpu_fallback_use_the_arenas(artifacts_dir, cli):
    """cuda (linear, relu) -> CPU fallback (a custom op) -> cuda (linear): each copy lands
    in the arena of the device that reads it; outputs are fresh; peaks are measured."""
    out = artifacts_dir / "custom-cuda.artifact"
    result = cli("build", "tests/models/custom_op.py:factory", "--target", "cuda",
                 "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    manifest = runtime.read_manifest(out)
    assert [p.device for p in manifest.partitions] == ["cuda", "cpu", "cuda"]
    arenas = manifest.memory_plan["arenas"]
    measured = json.loads(result.stdout)["measured"]["memory"]
    assert list(arenas["cpu"]["slots"]) == ["handoff/relu"]
    assert list(arenas["cuda"]["slots"]) == ["handoff/soft_clip"]
    assert measured["cuda_peak_bytes"] > 0
    import tests.models.custom_op as custom
    program = runtime.load(out)
    model, _, _ = custom.factory()
    first = None
    for batch in (16, 3):
        x = torch.randn(batch, 16)
        got = program(x.cuda())
        torch.testing.assert_close(got.cpu(), model(x), rtol=1e-4, atol=1e-5)
        first = first if first is not None else got.clone()
        assert first.shape[0] == 16  # the first call's output was not overwritten
    assert program.memory_report["cuda"]["handoffs"] == 1
