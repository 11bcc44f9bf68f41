"""Slower builds (one compile each): every zoo model, an ISA choice, a bf16 CPU build.
Run with `make test-slow`."""

from __future__ import annotations

import pytest
import torch

import exporter
import runtime
from exporter.model.zoo import ZOO

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_zoo_model_builds_validates_and_runs(name, artifacts_dir):
    result = exporter.build(f"zoo:{name}", target="cpu", out=artifacts_dir / f"zoo-{name}.artifact")
    assert result.manifest.validation["passed"] is True
    module, args, _ = ZOO[name]()
    got = torch.utils._pytree.tree_leaves(runtime.load(result.artifact)(*args))
    expected = torch.utils._pytree.tree_leaves(module(*args))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)


def test_avx2_build_needs_fewer_cpu_features(artifacts_dir):
    result = exporter.build("zoo:mlp", target="cpu", cpu_isa="avx2",
                            out=artifacts_dir / "mlp-avx2.artifact")
    flags = set(result.manifest.requirements.cpu_flags)
    assert "avx2" in flags and not any(f.startswith("avx512") for f in flags)


def test_bf16_cpu_build_validates_under_its_own_tolerance(artifacts_dir):
    result = exporter.build("zoo:encoder", target="cpu", dtype="bf16",
                            out=artifacts_dir / "encoder-bf16.artifact")
    assert result.manifest.validation["passed"] is True
    # the cast happens before capture, so its record comes before every graph pass
    cast = result.manifest.passes[0]
    assert cast["name"] == "cast_dtype" and cast["info"]["dtype"] == "bf16"
    assert cast["info"]["float_weight_bytes_after"] < cast["info"]["float_weight_bytes_before"]
