"""Quiet by default: a build says one line per stage's result (the validation's formula
and the memory plan's terms under --verbose), the random-inputs note once with how to give
real data; inspect hides passes that changed nothing and says when torch is not needed."""

from __future__ import annotations

import io

from rich.console import Console

import runtime
from exporter.report.console import print_build, print_manifest


def _printed(show, *args, verbose: bool) -> str:
    stream = io.StringIO()
    show(Console(file=stream, width=400), *args, verbose=verbose)
    return stream.getvalue()


def test_a_build_says_one_line_per_result_and_verbose_adds_the_terms(mlp_build):
    quiet = _printed(print_build, mlp_build, verbose=False)
    assert "policy:" not in quiet and "without reuse" not in quiet
    (memory,) = [line for line in quiet.splitlines() if line.startswith("memory")]
    assert memory.startswith("memory: activations ") and "--verbose" in memory
    assert quiet.count("random draws") == 1 and "--inputs FILE.npz" in quiet
    assert mlp_build.warnings == []  # the note is not a warning of the build
    loud = _printed(print_build, mlp_build, verbose=True)
    assert "policy: float outputs" in loud and "without reuse" in loud


def test_inspect_hides_passes_that_changed_nothing_unless_verbose(onnx_mlp):
    manifest = runtime.read_manifest(onnx_mlp)
    idle = [r["name"] for r in manifest.passes if not r["modified"]]
    quiet = _printed(print_manifest, manifest, str(onnx_mlp), verbose=False)
    assert idle and not any(f"pass {name}:" in quiet for name in idle)
    assert f"{len(idle)} more pass(es) ran and changed nothing" in quiet
    loud = _printed(print_manifest, manifest, str(onnx_mlp), verbose=True)
    assert all(f"pass {name}: no change" in loud for name in idle)


def test_inspect_says_an_onnx_artifact_runs_without_torch(onnx_mlp, mlp_build):
    onnx = _printed(print_manifest, runtime.read_manifest(onnx_mlp), "m", verbose=False)
    (line,) = [line for line in onnx.splitlines() if line.startswith("built for:")]
    assert "runs without torch" in line and not line.startswith("built for: linux-x86_64, torch")
    cpu = _printed(print_manifest, mlp_build.manifest, "m", verbose=False)
    assert "runs without torch" not in cpu and ", torch " in cpu


def test_a_small_artifacts_size_reads_in_kilobytes_not_as_zero_megabytes(onnx_mlp):
    from exporter.report.console import file_size
    assert file_size(2_900) == "2.9 kB" and file_size(1_650_000) == "1.65 MB"
    result = type("Built", (), {"artifact": onnx_mlp, "measured": {},
                                "manifest": runtime.read_manifest(onnx_mlp)})()
    built = _printed(print_build, result, verbose=False).splitlines()[0]
    assert " kB) for target onnx" in built and "0.00 MB" not in built
