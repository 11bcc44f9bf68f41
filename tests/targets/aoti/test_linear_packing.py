"""The cpu target leaves float32 linears on ATen's GEMM (MKL), not oneDNN's packed linear
(targets/aoti/linear_packing.py); its numbers against eager are test_build_cpu.py's."""

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
    with float32_linears_unpacked() as changed:
        assert changed >= 1 and all(isinstance(c, functools.partial) for c in checks())
    assert changed == len(checks())
    assert all(c.__module__.endswith("mkldnn_fusion") for c in checks())  # Inductor's own
