"""The cpu target's own candidate leaves float32 linears on ATen's GEMM (MKL), not oneDNN's
packed linear (targets/aoti/linear_packing.py), and counts their multiply-adds; its numbers
against eager are test_build_cpu.py's."""

from __future__ import annotations

import functools
import io
import zipfile

import pytest
import torch

from runtime.format.archive import ArtifactReader
from targets.aoti.linear_packing import CHECK_NAME, float32_linears_unpacked

needs_mkl = pytest.mark.skipif(not torch._C.has_mkl, reason="torch without MKL (not x86)")


def _libraries(artifact) -> bytes:
    with ArtifactReader.open(artifact) as reader:
        package = zipfile.ZipFile(io.BytesIO(reader.read_bytes("partitions/p0/model.pt2")))
    return b"".join(package.read(name) for name in package.namelist() if name.endswith(".so"))


@needs_mkl
def test_a_cpu_builds_float32_linears_call_atens_gemm_not_onednns_linear(mlp_build):
    library = _libraries(mlp_build.artifact)
    assert library, "the package holds no library"
    assert b"_linear_pointwise" not in library  # oneDNN's packed linear (Inductor's AOT default)
    assert b"aoti_torch_cpu_addmm_out" in library or b"aoti_torch_cpu_mm_out" in library


@needs_mkl
def test_inductors_own_checks_are_back_after_the_build():
    from torch._inductor.fx_passes import freezing_patterns

    def checks():
        return [entry.extra_check for patterns in freezing_patterns.pass_patterns
                for found in patterns.patterns.values() for entry in found
                if getattr(entry.extra_check, "__name__", "") == CHECK_NAME]
    with float32_linears_unpacked() as unpacked:
        assert unpacked.patterns >= 1
        assert all(isinstance(c, functools.partial) for c in checks())
    assert unpacked.patterns == len(checks())
    assert all(c.__module__.endswith("mkldnn_fusion") for c in checks())  # Inductor's own


@needs_mkl
def test_the_multiply_adds_of_the_linears_left_unpacked_are_counted_once_each():
    """What says whether Inductor's own packing is worth a compile (choice.PACKED)."""
    model = torch.nn.Sequential(torch.nn.Linear(32, 16),
                                torch.nn.Linear(16, 8, bias=False)).eval()
    torch._dynamo.reset()
    with torch.no_grad(), torch._inductor.config.patch(freezing=True), \
            float32_linears_unpacked() as unpacked:
        out = torch.compile(model)(torch.randn(64, 32))
    assert out.shape == (64, 8)
    assert unpacked.macs == 64 * 32 * 16 + 64 * 16 * 8  # addmm and mm, each once
