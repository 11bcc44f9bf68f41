"""The onnx target's own kernels in a build (targets/onnx/kernels): an int8-weight
generating build runs its GEMVs and decode attention on them, records so in the manifest,
greedy-decodes the tokens ONNX Runtime's own ops decode, refuses a CPU without their ISA
(exit 2), and a wrong kernel fails the build's gate; --no-own-kernels and a build for
another platform keep ONNX Runtime's ops."""

from __future__ import annotations

import shutil

import pytest

import exporter
import runtime
from exporter.ship.archive_writer import write_artifact
from runtime.errors import CompatibilityError
from runtime.format.archive import ArtifactReader
from runtime.host.platforms import host_platform
from runtime.program.requires import loads_on
from targets.onnx import kernels
from tests.conftest import ROOT

pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(kernels.unusable(host_platform()) is not None,
                                reason="the kernels need an x86-64 CPU with AVX2+FMA")

TINY = f"{ROOT / 'tests' / 'models' / 'tiny_lm.py'}:factory"
ONE_LAYER = f"{ROOT / 'tests' / 'models' / 'tiny_lm.py'}:one_layer"
# the tiny random model's own gate (tests/exporter/lm/test_generation.py)
GATE = dict(min_top1=0.3, max_kl=0.5)


def _build(out, spec=TINY, **settings):
    return exporter.build(spec, task="text-generation", target="onnx", max_context=32,
                          quantize="int8-weight", out=out, **GATE, **settings)


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    folder = tmp_path_factory.mktemp("own-kernels")
    return {own: _build(folder / f"tiny-{own}.artifact", own_kernels=own)
            for own in (True, False)}


def test_the_manifest_records_the_nodes_on_our_kernels_and_their_isa(builds):
    (ours,) = builds[True].manifest.partitions
    (theirs,) = builds[False].manifest.partitions
    nodes = ours.meta["kernels_nodes"]
    # 2 layers: q/k/v with its norm, the gate/up with its norm and SwiGLU, o and down
    # projections, the head; each layer's attention
    assert nodes == {"MatMulNBitsNorm": 2, "MatMulNBitsNormGLU": 2, "MatMulNBits": 5,
                     "GroupQueryAttention": 2}
    assert ours.meta["kernels"] in ours.files and ours.meta["kernels"].endswith(".so")
    assert (ours.meta["kernels_platform"], ours.meta["kernels_cpu_flags"]) == (
        "linux-x86_64", ["avx2", "fma"])
    assert builds[True].manifest.requirements.cpu_isa == kernels.ISA
    # native code now: it loads on its platform, with that ISA (`exporter inspect` says so)
    assert loads_on(builds[True].manifest)["platforms"] == ["linux-x86_64"]
    assert loads_on(builds[False].manifest)["any_platform"]
    assert not any(k.startswith("kernels") for k in theirs.meta)  # --no-own-kernels
    assert builds[True].manifest.validation["passed"]


def test_our_kernels_decode_the_tokens_onnx_runtimes_ops_decode(builds):
    prompt = [5, 9, 3, 17]
    tokens = {own: runtime.load(b.artifact).generate(prompt, 12, stop_at_eos=False).tokens
              for own, b in builds.items()}
    assert tokens[True] == tokens[False] and len(tokens[True]) == 12


def test_a_cpu_without_the_kernels_isa_is_refused_with_exit_2(builds, tmp_path, cli_here):
    bad = tmp_path / "future-cpu.artifact"
    with ArtifactReader.open(builds[True].artifact) as reader:
        manifest = dict(reader.manifest)
        files = {name: reader.read_bytes(name) for name in reader.names()}
    manifest["partitions"][0]["meta"]["kernels_cpu_flags"] += ["avx1024_imaginary"]
    write_artifact(bad, manifest, files)
    with pytest.raises(CompatibilityError, match="lacks avx1024_imaginary") as caught:
        runtime.load(bad)
    assert "--no-own-kernels" in caught.value.hint
    done = cli_here("generate", str(bad), "--prompt-ids", "1,2,3")
    assert done.returncode == 2 and "avx1024_imaginary" in done.stderr
    assert "Traceback" not in done.stderr


def test_packaging_for_another_platform_is_refused_before_anything_is_written(
        builds, tmp_path, cli_here):
    """The kernel library is x86-64 code: a bundle for aarch64 would be refused on the
    device, so `exporter package` refuses it here (exit 2, no bundle, the way out named)."""
    out = tmp_path / "arm.tar.gz"
    done = cli_here("package", str(builds[True].artifact), "--platform", "linux-aarch64",
                    "--out", str(out))
    assert done.returncode == 2, done.stderr
    assert "linux-x86_64" in done.stderr and "linux-aarch64" in done.stderr
    # rebuilt for aarch64, the graph keeps ONNX Runtime's ops (the last test)
    assert "exporter build --platform linux-aarch64" in done.stderr
    assert not out.exists() and "Traceback" not in done.stderr


def test_a_wrong_kernel_fails_the_builds_gate(tmp_path, monkeypatch):
    """The gate runs the rewritten graph on the packed library: GEMVs whose scales are
    negated (a sign slip in the kernel) must not ship."""
    from exporter.errors import ValidationFailedError

    broken = tmp_path / "kernels"
    shutil.copytree(kernels.HERE, broken, ignore=shutil.ignore_patterns("*.py", "__py*"))
    for tiles, right in (("nbits_tiles.h", "_mm256_set1_ps(ws[r * nb + b] * xs[b])"),
                         ("nbits_vnni.h", "_mm256_set1_ps(wsp[b * R + r] * xs[b])")):
        source = (broken / tiles).read_text()  # the GEMV tiles, AVX2's and AVX-512's
        assert source.count(right) == 1
        (broken / tiles).write_text(source.replace(right, right.replace("(", "(-", 1)))
    monkeypatch.setattr(kernels, "HERE", broken)
    with pytest.raises(ValidationFailedError):  # one layer: its GEMVs run the same code
        _build(tmp_path / "broken.artifact", ONE_LAYER)
    assert not (tmp_path / "broken.artifact").exists()


def test_a_build_for_another_platform_keeps_onnx_runtimes_ops_and_says_so(tmp_path):
    """The library is x86-64 AVX2 code: the graph for aarch64 keeps ORT's ops, one line."""
    import onnx
    from onnx import helper

    node = helper.make_node("MatMulNBits", ["a", "b", "s"], ["y"], domain="com.microsoft",
                            K=256, N=8, bits=4, block_size=128, accuracy_level=4)
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(helper.make_graph([node], "g", [], [])), str(path))
    before = path.read_bytes()
    found, note = kernels.apply(path, "linux-aarch64")
    assert found is None and path.read_bytes() == before
    assert "1 node(s) keep ONNX Runtime's own" in note and "linux-aarch64" in note
    assert "\n" not in note
