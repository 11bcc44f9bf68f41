"""Bad input gets a clear error, exit code 2, no traceback, and nothing lost.

Covers: missing or malformed specs, truncated or tampered artifacts, hostile entry
names, an artifact built for another CPU/torch, data-dependent control flow, and a
model whose eager behaviour the artifact cannot reproduce (exit 1, nothing written).
"""

from __future__ import annotations

import json
import re
import shutil
import zipfile

import pytest

import runtime
from runtime.format.archive import ArtifactReader
from exporter.ship.archive_writer import write_artifact
from runtime.errors import ArtifactError, CompatibilityError

MODELS = "tests/models"


def _assert_clean_error(result, code: int, *needles: str) -> None:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


@pytest.mark.parametrize("spec, needle", [
    ("", "spec"),
    ("no_colon_here", "zoo:NAME"),
    ("does/not/exist.py:factory", "does/not/exist.py"),
    (f"{MODELS}/stateful.py:missing_name", "missing_name"),
    ("zoo:nope", "mlp"),
    ("not_a_module_xyz:factory", "not_a_module_xyz"),
])
def test_bad_specs_exit_2(cli_here, spec, needle):
    _assert_clean_error(cli_here("build", spec, "--no-validate"), 2, needle)


def test_bad_dynamic_and_unknown_target_exit_2(cli_here):
    _assert_clean_error(cli_here("build", "zoo:mlp", "--dynamic", "x:0=9..2"), 2, "--dynamic")
    _assert_clean_error(cli_here("build", "zoo:mlp", "--dynamic", "nope:0=1..4"), 2, "nope")
    _assert_clean_error(cli_here("build", "zoo:mlp", "--target", "toaster"), 2, "toaster")
    # ONNX Runtime's CPU provider has no bfloat16 kernels: every op ran on the fallback
    _assert_clean_error(cli_here("build", "zoo:mlp", "--target", "onnx", "--dtype", "bf16"), 2,
                        "--dtype bf16 on target onnx", "--dtype fp16")
    # generation options on a plain forward build meant nothing, and were accepted
    _assert_clean_error(cli_here("build", "zoo:mlp", "--max-context", "32", "--prefill-chunk",
                                 "8", "--dry-run"), 2,
                        "--max-context, --prefill-chunk apply to --task text-generation only")


def test_options_that_would_do_nothing_are_refused():
    """Options that would do nothing were accepted silently: --quant-block without a
    weight-only recipe, --min-top1/--max-kl where no gate reads them (an fp32 generating
    build, whose tokens must be transformers', or a plain forward pass), --min-sqnr/
    --min-cosine on a generating build (judged by top-1 and KL) or a float one. (The CLI
    turns a ValidationError into exit 2, as for --max-context above.)"""
    from pydantic import ValidationError

    from exporter.settings import BuildSettings
    for settings, said in [
            (dict(target="onnx", quant_block=32), "--quant-block (blocks of --quantize "
             "int8-weight or int4-weight) does nothing in a float build"),
            (dict(task="text-generation", min_top1=0.5), "not an fp32 text-generation build"),
            (dict(quantize="int8-weight", max_kl=0.5), "not a plain forward pass"),
            (dict(task="text-generation", quantize="int8-weight", min_top1=0.5,
                  quant_min_sqnr_db=30.0), "--min-sqnr bounds the output gate of quantized "
                                           "forward passes, not a text-generation build"),
            (dict(quant_min_cosine=0.999), "not a float build"),
            (dict(task="text-generation", prefill_chunk=1), "1 is under 2: one token is a "
             "decode step")]:
        with pytest.raises(ValidationError, match=re.escape(said)):
            BuildSettings(**settings)
    BuildSettings(task="text-generation", dtype="fp16", min_top1=0.5)  # its gate reads it


def test_debug_flag_shows_the_traceback(cli_here):
    result = cli_here("--debug", "build", "zoo:nope")
    assert result.returncode == 2 and "Traceback" in result.stderr


def test_data_dependent_control_flow_is_one_paragraph(cli_here):
    result = cli_here("build", f"{MODELS}/stateful.py:data_dependent")
    _assert_clean_error(result, 3, "stateful.py", "torch.cond")


def _copy(src, dst):
    shutil.copyfile(src, dst)
    return dst


def test_flipped_byte_is_refused(mlp_build, cli_here, tmp_path):
    data = bytearray(mlp_build.artifact.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "flipped.artifact"
    bad.write_bytes(bytes(data))
    with pytest.raises(ArtifactError):
        runtime.load(bad)
    _assert_clean_error(cli_here("inspect", str(bad)), 2, "flipped.artifact")


def test_truncated_artifact_is_refused(mlp_build, cli_here, tmp_path):
    bad = tmp_path / "truncated.artifact"
    bad.write_bytes(mlp_build.artifact.read_bytes()[:1000])
    _assert_clean_error(cli_here("run", str(bad), "--inputs", "x.npz"), 2, "truncated")


def test_entry_named_dotdot_is_refused(mlp_build, cli_here, tmp_path):
    bad = _copy(mlp_build.artifact, tmp_path / "dotdot.artifact")
    with zipfile.ZipFile(bad, "a") as archive:
        archive.writestr("../x", b"payload")
    _assert_clean_error(cli_here("inspect", str(bad)), 2, "../x")
    assert not (tmp_path.parent / "x").exists()


def _rewrite_manifest(src, dst, change) -> None:
    with ArtifactReader.open(src) as reader:
        manifest = dict(reader.manifest)
        files = {name: reader.read_bytes(name) for name in reader.names()}
    change(manifest)
    write_artifact(dst, manifest, files)


def test_artifact_for_a_missing_cpu_feature_is_refused_before_loading(mlp_build, tmp_path):
    bad = tmp_path / "future-cpu.artifact"
    _rewrite_manifest(mlp_build.artifact, bad, lambda m: m["requirements"].update(
        cpu_flags=m["requirements"]["cpu_flags"] + ["avx1024_imaginary"]))
    with pytest.raises(CompatibilityError, match="avx1024_imaginary"):
        runtime.load(bad)


def test_artifact_for_another_torch_names_both_versions(mlp_build, tmp_path):
    bad = tmp_path / "old-torch.artifact"
    _rewrite_manifest(mlp_build.artifact, bad,
                      lambda m: m["requirements"].update(torch="1.13.0"))
    with pytest.raises(CompatibilityError, match=r"torch 1\.13\.0.*torch 2\."):
        runtime.load(bad)


@pytest.fixture(scope="session")
def failed_validation(artifacts_dir, cli_here):
    out = artifacts_dir / "differs.artifact"
    out.write_bytes(b"previous good artifact")
    # onnx: the failure and its bisect are the same on every target; the default cpu
    # target's AOTInductor compile was 21 of the build's 25 CPU s
    result = cli_here("build", f"{MODELS}/stateful.py:export_differs", "--target", "onnx",
                      "--out", str(out), "--keep-failed", "--json")
    return out, result


def test_validation_failure_exits_1_and_keeps_the_previous_file(failed_validation):
    out, result = failed_validation
    assert result.returncode == 1, result.stderr
    assert out.read_bytes() == b"previous good artifact"
    data = json.loads(result.stdout)
    assert data["validation"]["passed"] is False
    assert "output" in result.stderr and "max abs error" in result.stderr
    kept = out.with_name("differs.FAILED-VALIDATION.artifact")
    assert kept.exists(), "--keep-failed keeps the failing artifact, clearly named"
    assert not list(out.parent.glob(".differs*")), "no staging files left behind"


def test_validation_failure_bisects_to_the_capture(failed_validation):
    """The model takes another path under torch.export: every partition matches the
    exported program, which differs from the model; the error says so."""
    _, result = failed_validation
    found = json.loads(result.stdout)["validation"]["bisect"]
    assert found["first_divergent"] is None
    assert all(not row["diverges"] for row in found["partitions"])
    assert [c["diverges"] for c in found["capture"]] == [True]
    assert "torch.export captured another code path" in result.stderr


def test_gpu_artifact_without_a_gpu_names_both_sides(mlp_build, tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    gpu = tmp_path / "gpu.artifact"
    _rewrite_manifest(mlp_build.artifact, gpu, lambda m: m["requirements"].update(
        cuda="13.0", cuda_capability="9.0"))
    with pytest.raises(CompatibilityError, match=r"capability 9\.0.*none is usable here"):
        runtime.load(gpu)


def test_cuda_target_without_cuda_fails_before_any_work(cli_here):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = cli_here("build", "zoo:mlp", "--target", "cuda")
    _assert_clean_error(result, 2, "cuda", torch.__version__)
    assert "load model" not in result.stderr, "no work may start before the target check"
    listed = json.loads(cli_here("targets", "--json").stdout)["targets"]
    cuda = next(t for t in listed if t["name"] == "cuda")
    assert cuda["available"] is False and torch.__version__ in cuda["reason"]
