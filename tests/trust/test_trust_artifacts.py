"""Hostile artifacts and inputs, each refused with exit 2 before it costs memory, disk
or a traceback.

Every artifact here is a real build (zoo:mlp on onnx) edited the way an attacker would:
rewritten manifests are re-hashed, so they pass the archive's integrity checks and reach
the checks under test.
"""

from __future__ import annotations

import json
import shutil
import zipfile

import numpy as np
import pytest

import runtime
from runtime.format.archive import ArtifactReader
from exporter.ship.archive_writer import write_artifact
from runtime.errors import ArtifactError, CompatibilityError

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _rewrite(src, dst, change=None, extra: dict | None = None):
    with ArtifactReader.open(src) as reader:
        manifest = json.loads(json.dumps(reader.manifest))
        files = {name: reader.read_bytes(name) for name in reader.names()}
    if change:
        change(manifest)
    files.update(extra or {})
    write_artifact(dst, manifest, files)
    return dst


def _clean(result, code=2, *needles):
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


# --- expansion bombs -------------------------------------------------------------------

def test_many_small_entries_that_inflate_are_refused_before_extraction(onnx_mlp, tmp_path):
    """Each entry is under the per-entry ratio exemption; together they are a bomb."""
    zeros = b"\0" * ((1 << 20) - 1)
    extra = {f"pad/{i:04d}.bin": zeros for i in range(40)}
    bomb = _rewrite(onnx_mlp, tmp_path / "bomb.artifact", extra=extra)
    # the writer stores .bin uncompressed; deflate them as an attacker would
    packed = tmp_path / "packed.artifact"
    with zipfile.ZipFile(bomb) as src, zipfile.ZipFile(packed, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            info.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(info, data)
    with pytest.raises(ArtifactError, match="ratio|zip bomb"):
        runtime.load(packed)


def test_total_inflated_size_has_a_limit(onnx_mlp, tmp_path):
    from runtime.format.archive import Limits
    padded = _rewrite(onnx_mlp, tmp_path / "padded.artifact",
                      extra={"pad/a.bin": b"x" * (3 << 20)})
    with pytest.raises(ArtifactError, match="max_total_bytes"):
        runtime.load(padded, limits=Limits(max_total_bytes=2 << 20))


def test_unused_entries_are_not_extracted(onnx_mlp, tmp_path, monkeypatch):
    padded = _rewrite(onnx_mlp, tmp_path / "padded.artifact",
                      extra={"notes/unused.bin": b"u" * 4096})
    copied = []
    real = ArtifactReader._copy_entry
    monkeypatch.setattr(ArtifactReader, "_copy_entry",
                        lambda self, root, name, *a: copied.append(name) or real(self, root, name, *a))
    runtime.load(padded)
    assert copied and all(name.startswith("partitions/") for name in copied)


def test_npz_claiming_more_than_the_inputs_take_is_refused_unread(onnx_mlp, tmp_path, cli):
    """A 1 MiB deflated .npz of zeros whose array is 64x the largest input (batch 32)."""
    big = tmp_path / "big.npz"
    np.savez_compressed(big, x=np.zeros((32 * 64, 64 * 8), np.float32))
    _clean(cli("run", str(onnx_mlp), "--inputs", str(big)), 2, "more than", "bytes")


def test_npy_header_claiming_terabytes_is_refused(onnx_mlp, tmp_path, cli):
    header = tmp_path / "x.npy"
    with open(header, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (1 << 20, 1 << 20)})
    lie = tmp_path / "lie.npz"
    with zipfile.ZipFile(lie, "w") as archive:
        archive.write(header, "x.npy")
    _clean(cli("run", str(onnx_mlp), "--inputs", str(lie)), 2, "claims", "'x'")


# --- partition paths outside the verified copy ---------------------------------------------

@pytest.mark.parametrize("path", ["/etc/passwd", "../../outside.onnx", "partitions/p0/nope.onnx"])
def test_partition_file_must_be_a_verified_entry(onnx_mlp, tmp_path, path):
    def point_outside(manifest):
        manifest["partitions"][0]["meta"]["model"] = path
    bad = _rewrite(onnx_mlp, tmp_path / "outside.artifact", point_outside)
    with pytest.raises(ArtifactError, match="not an entry of the artifact"):
        runtime.load(bad)


# --- inspect never claims an unchecked signature -------------------------------------------

def test_inspect_says_not_verified_for_stale_or_garbage_signatures(onnx_mlp, tmp_path,
                                                                   cli_here):
    cli, keys = cli_here, tmp_path / "keys"
    assert cli("keygen", "--out-dir", str(keys)).returncode == 0, "keygen makes its folder"
    signed = shutil.copy(onnx_mlp, tmp_path / "signed.artifact")
    assert cli("sign", str(signed), "--key", str(keys / "signing.key")).returncode == 0
    verified = cli("inspect", str(signed), "--trusted-key", str(keys / "signing.pub"))
    assert "(verified)" in verified.stdout, verified.stdout
    # the library swapped (manifest rewritten and re-hashed), the old signature kept
    with ArtifactReader.open(signed) as reader:
        old_signature = reader.signature_bytes()
    swapped = _rewrite(signed, tmp_path / "swapped.artifact",
                       lambda m: m["build"].update(notes=["swapped"]))
    with zipfile.ZipFile(swapped, "a") as archive:
        archive.writestr("manifest.sig", old_signature)
    garbage = shutil.copy(onnx_mlp, tmp_path / "garbage.artifact")
    with zipfile.ZipFile(garbage, "a") as archive:
        archive.writestr("manifest.sig", b'{"key_id": "0123456789abcdef", "signature": "00"}')
    plain = cli("inspect", str(swapped))
    assert plain.returncode == 0 and "signed by" not in plain.stdout
    assert "signature present, not verified" in plain.stdout
    checked = cli("inspect", str(garbage), "--trusted-key", str(keys / "signing.pub"), "--json")
    status = json.loads(checked.stdout)["signature"]
    assert status["present"] and not status["verified"] and status["problem"], status
    from runtime.format.signing import describe_signature, signature_status
    for artifact in (swapped, garbage):  # the same judgement the command prints, in-process
        with ArtifactReader.open(artifact) as reader:
            unchecked = signature_status(reader)
            checked = signature_status(reader, [keys / "signing.pub"])
        assert describe_signature(unchecked).startswith("signature present, not verified")
        assert checked["present"] and not checked["verified"] and checked["problem"], checked


# --- inconsistent manifests and inputs: exit 2 at load, never a KeyError later -----------

def _rename_first_partition_input(manifest):
    manifest["partitions"][0]["inputs"] = ["no_such_tensor"]


def _bogus_output_tree(manifest):
    manifest["signature"]["output_tree"] = {"kind": "dict", "keys": ["a", "b"],
                                            "items": [{"leaf": 0}, {"leaf": 7}]}


def _huge_arena(manifest):
    manifest["memory_plan"] = {"arenas": {"cpu": {"arena_bytes": 1 << 40, "slots": {}}}}


def _cuda_partition(manifest):
    manifest["partitions"][0]["device"] = "cuda"


@pytest.mark.parametrize("change, needle", [
    (_rename_first_partition_input, "no_such_tensor"),
    (_bogus_output_tree, "output tree"),
    (_huge_arena, "GiB"),
    (_cuda_partition, "CUDA"),
], ids=["dangling-input", "output-tree", "1TiB-arena", "cuda-on-cpu-host"])
def test_inconsistent_manifest_is_refused_at_load(onnx_mlp, tmp_path, cli_here, change,
                                                  needle):
    import torch
    if change is _cuda_partition and torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    bad = _rewrite(onnx_mlp, tmp_path / "bad.artifact", change)
    with pytest.raises((ArtifactError, CompatibilityError), match=needle):
        runtime.load(bad)
    np.savez(tmp_path / "in.npz", x=np.zeros((2, 64), np.float32))
    _clean(cli_here("run", str(bad), "--inputs", str(tmp_path / "in.npz")), 2, needle)


def _garbage_validation_cases(manifest):
    manifest["validation"]["cases"] = "x"


def _arena_not_an_object(manifest):
    manifest["memory_plan"]["arenas"] = "x"


def _coverage_row_without_op(manifest):
    del manifest["coverage"][0]["op"]


def _target_not_a_string(manifest):
    manifest["target"] = 7


@pytest.mark.parametrize("change", [_garbage_validation_cases, _arena_not_an_object,
                                    _coverage_row_without_op, _target_not_a_string],
                         ids=["validation", "arenas", "coverage", "target"])
def test_malformed_report_sections_are_exit_2_for_inspect_and_report(onnx_mlp, tmp_path,
                                                                     cli_here, change):
    """The loader never reads these sections; the commands that show them must not
    crash on them either (exit 4 'a bug in the exporter' before)."""
    bad = str(_rewrite(onnx_mlp, tmp_path / "bad.artifact", change))
    for args in (["inspect", bad], ["-v", "inspect", bad],
                 ["report", bad, "--html", str(tmp_path / "r.html")]):
        _clean(cli_here(*args), 2, "malformed")
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("make, needle", [
    (lambda p: np.save(p, np.zeros((2, 64), np.float32)), ".npy file"),
    (lambda p: np.savez(p, x=np.array(["a", "b"])), "dtype"),
    (lambda p: np.savez(p, x=np.array(["2020-01-01"], "datetime64[D]")), "dtype"),
    (lambda p: np.savez(p, x=np.zeros(2, [("a", "f4"), ("b", "i4")])), "dtype"),
], ids=["npy", "str", "datetime", "structured"])
def test_inputs_that_are_not_numeric_arrays_are_exit_2(onnx_mlp, tmp_path, cli_here, make,
                                                       needle):
    path = tmp_path / "in.npz"
    with open(path, "wb") as fh:
        make(fh)
    _clean(cli_here("run", str(onnx_mlp), "--inputs", str(path)), 2, needle)


def test_an_npz_naming_an_array_twice_or_a_fifo_is_refused(onnx_mlp, tmp_path, cli_here):
    import io
    import os
    buffer = io.BytesIO()
    np.save(buffer, np.zeros((2, 64), np.float32))
    twice = tmp_path / "twice.npz"
    with pytest.warns(UserWarning), zipfile.ZipFile(twice, "w") as zf:  # "Duplicate name"
        zf.writestr("x.npy", buffer.getvalue())
        zf.writestr("x.npy", buffer.getvalue())
    _clean(cli_here("run", str(onnx_mlp), "--inputs", str(twice)), 2, "'x' twice")
    os.mkfifo(tmp_path / "fifo")  # never opened: a read would block
    _clean(cli_here("run", str(onnx_mlp), "--inputs", str(tmp_path / "fifo")), 2,
           "not a regular file")


def test_run_out_problems_are_exit_2_and_out_writes_the_file_named(onnx_mlp, tmp_path,
                                                                   cli_here):
    np.savez(tmp_path / "in.npz", x=np.zeros((2, 64), np.float32))
    inputs, cli = str(tmp_path / "in.npz"), cli_here
    _clean(cli("run", str(onnx_mlp), "--inputs", inputs, "--out", str(tmp_path / "no/o.npz")),
           2, "does not exist")
    _clean(cli("run", str(onnx_mlp), "--inputs", str(tmp_path)), 2, "is a directory")
    # "--out X" writes X itself (numpy alone would write X.npz and we said "wrote X")
    ok = cli("run", str(onnx_mlp), "--inputs", inputs, "--out", str(tmp_path / "X"))
    assert ok.returncode == 0 and f"wrote {tmp_path / 'X'}" in ok.stdout
    assert (tmp_path / "X").is_file() and not (tmp_path / "X.npz").exists()
    assert set(np.load(tmp_path / "X").files) == {"output"}


# --- inspect shows a manifest's text, never its terminal escape sequences ---------------

def test_inspect_escapes_control_characters(onnx_mlp, tmp_path, cli):
    evil = "\x1b]0;owned\x07\x1b[2J\x1b[31mspec"
    bad = _rewrite(onnx_mlp, tmp_path / "escapes.artifact",
                   lambda m: m["source"].update(spec=evil))
    shown = cli("inspect", str(bad))
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\\x1b]0;owned" in shown.stdout


def test_validate_against_the_wrong_model_is_a_usage_error(onnx_mlp, cli_here):
    for model in ("zoo:cnn", "zoo:encoder"):
        _clean(cli_here("validate", str(onnx_mlp), "--model", model), 2, "built from")


def test_a_failed_aotinductor_load_leaves_no_unpacked_folder(onnx_mlp, tmp_path):
    """The C++ loader unpacks a package under $TMPDIR and leaves it when loading fails."""
    import io
    import os
    import tempfile
    package = io.BytesIO()
    with zipfile.ZipFile(package, "w") as archive:  # a .pt2 that unpacks, then fails to load
        archive.writestr("model/data/aotinductor/model/model.so", b"\x7fELF not really")
        archive.writestr("model/archive_format", b"pt2")

    def to_aoti(manifest):
        part = manifest["partitions"][0]
        part["backend"], part["meta"] = "aoti", {"package": "partitions/p0/model.pt2"}
        manifest["partitions"][0]["files"] = ["model.pt2"]
    with ArtifactReader.open(onnx_mlp) as reader:
        manifest = json.loads(json.dumps(reader.manifest))
    to_aoti(manifest)
    bad = write_artifact(tmp_path / "bad-aoti.artifact", manifest,
                         {"partitions/p0/model.pt2": package.getvalue()})
    temp = tempfile.gettempdir()
    before = set(os.listdir(temp))
    with pytest.raises(ArtifactError, match="could not load partition 'p0'"):
        runtime.load(bad)
    left = sorted(n for n in set(os.listdir(temp)) - before if n.startswith(("aotinductor", "aoti")))
    assert left == [], left


# --- a hash-consistent artifact whose graph the backend refuses is bad input, not a build -----

def _unknown_op_graph() -> bytes:
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["output"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, None)])
    return helper.make_model(graph).SerializeToString()


def _undefined_input_graph() -> bytes:
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Relu", ["nowhere"], ["output"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, None)])
    return helper.make_model(graph).SerializeToString()


@pytest.mark.parametrize("graph", [_unknown_op_graph, _undefined_input_graph],
                         ids=["unknown-op", "undefined-input"])
def test_an_onnx_graph_the_runtime_refuses_is_a_bad_artifact_at_run(onnx_mlp, tmp_path,
                                                                     cli_here, graph):
    pytest.importorskip("onnx")
    with ArtifactReader.open(onnx_mlp) as reader:
        (entry,) = [n for n in reader.names() if n.endswith(".onnx")]
    bad = _rewrite(onnx_mlp, tmp_path / "refused.artifact", extra={entry: graph()})
    np.savez(tmp_path / "in.npz", x=np.zeros((2, 64), np.float32))
    result = cli_here("run", str(bad), "--inputs", str(tmp_path / "in.npz"))
    _clean(result, 2, "could not load partition 'p0'", f"{bad}: {entry}")
    assert result.stderr.count("error:") == 1 and "edge-artifact-" not in result.stderr
    as_json = cli_here("run", str(bad), "--inputs", str(tmp_path / "in.npz"), "--json")
    assert as_json.returncode == 2
    assert json.loads(as_json.stdout)["error"]["exit_code"] == 2


def test_a_tvm_library_the_runtime_refuses_is_a_bad_artifact(onnx_mlp, tmp_path):
    pytest.importorskip("tvm")

    def to_tvm(manifest):
        part = manifest["partitions"][0]
        part["backend"], part["files"] = "tvm", ["lib.so", "params.safetensors"]
        part["meta"] = {"library": "partitions/p0/lib.so",
                        "params": "partitions/p0/params.safetensors", "num_params": 0}
    with ArtifactReader.open(onnx_mlp) as reader:
        manifest = json.loads(json.dumps(reader.manifest))
    to_tvm(manifest)
    bad = write_artifact(tmp_path / "bad-tvm.artifact", manifest,
                         {"partitions/p0/lib.so": b"\x7fELF not really",
                          "partitions/p0/params.safetensors": b"not read"})
    with pytest.raises(ArtifactError, match="TVM could not load partition 'p0'"):
        runtime.load(bad)


def test_numpy_views_torch_cannot_take_run_and_object_arrays_are_input_errors(onnx_mlp):
    """A reversed view or a big-endian array is a valid input (torch.from_numpy refuses
    both); an object array is an InputMismatchError, not torch's TypeError."""
    from runtime.errors import InputMismatchError
    program = runtime.load(onnx_mlp)
    x = np.random.default_rng(0).random((2, 64), np.float32)
    expected = program.run({"x": x})["output"]
    for view in (np.ascontiguousarray(x[:, ::-1])[:, ::-1], x.astype(">f4")):
        np.testing.assert_array_equal(program.run({"x": view})["output"], expected)
    with pytest.raises(InputMismatchError, match="object"):
        program.run({"x": np.full((2, 64), None, dtype=object)})


def test_one_trusted_key_given_as_a_string_is_that_key(onnx_mlp, tmp_path, cli_here):
    """Not its characters ('/' was read as a key folder)."""
    keys = tmp_path / "keys"
    _clean(cli_here("keygen", "--out-dir", str(keys)), 0)
    signed = tmp_path / "signed.artifact"
    shutil.copy(onnx_mlp, signed)
    _clean(cli_here("sign", str(signed), "--key", str(keys / "signing.key")), 0)
    runtime.load(signed, trusted_keys=str(keys / "signing.pub"))
    runtime.load(signed, trusted_keys=keys / "signing.pub")
