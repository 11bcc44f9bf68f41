"""--task text-generation on executorch: prefill and decode as two .pte programs over the
runtime's static KV cache (the cache rows are inputs, the new rows outputs, as on every
target), token for token equal to transformers' greedy generation at fp32."""

from __future__ import annotations

import pytest
import torch

import exporter
import runtime
from tests.conftest import ROOT

pytest.importorskip("executorch")
pytest.importorskip("transformers")


class _Remainders(torch.nn.Module):
    def forward(self, a, b, f):
        return (torch.remainder(a, b), torch.remainder(a, -3), torch.remainder(f, 3.0),
                torch.remainder(a, 5))


def test_integer_remainder_of_a_negative_number_follows_torch_on_executorch(tmp_path):
    """ExecuTorch's kernels gave remainder(-1, 8) = -1 (C's sign rule), torch 7: the
    cache mask of a generating build's decode (remainder(start - 1 - slot, slots)) let
    empty slots in and no token matched. The target's pass makes it torch's."""
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    from targets.executorch.floor_remainder import FloorRemainder
    args = (torch.tensor([-7, -1, 0, 5, 7, 6]), torch.tensor([3, -3, 3, -3, 3, 3]),
            torch.tensor([-7.5, -1.0, 0.0, 5.5, 7.0, 1.0]))
    result = FloorRemainder()(torch.export.export(_Remainders(), args))
    assert result.modified and result.info == {"remainders": 3}  # the float one kept
    path = tmp_path / "remainders.pte"
    path.write_bytes(to_edge_transform_and_lower(result.program).to_executorch().buffer)
    got = Runtime.get().load_program(path).load_method("forward").execute(list(args))
    for value, want in zip(got, _Remainders()(*args)):
        assert value.tolist() == want.tolist()


@pytest.fixture(scope="module")
def executorch_lm(tmp_path_factory):
    out = tmp_path_factory.mktemp("executorch-lm") / "llama-executorch.artifact"
    return exporter.build(f"{ROOT / 'tests' / 'models' / 'tiny_lm.py'}:factory",
                          task="text-generation", target="executorch", max_context=32,
                          out=out)


@pytest.mark.slow  # two ExecuTorch lowerings of a 2-layer decoder
def test_executorch_generating_build_gives_transformers_tokens(executorch_lm):
    manifest = executorch_lm.manifest
    record = manifest.validation
    assert record["passed"] and record["tokens_identical"]
    assert sorted(manifest.entry_points) == ["decode"]
    for view in (manifest, manifest.entry_points["decode"]):
        backends = {p.backend for p in view.partitions}
        assert backends == {"executorch"}
        # the attention's matmuls and the projections inside XNNPACK
        assert sum(p.meta["xnnpack_ops"] for p in view.partitions) > 0
    # the Python API's generate, from a fresh load, against transformers' greedy tokens
    from exporter.lm.validate import hf_greedy
    from tests.models import tiny_lm
    prompt = [1, 17, 42, 99, 5, 250, 7, 3, 64, 11]
    got = runtime.load(executorch_lm.artifact).generate(prompt, 12, stop_at_eos=False)
    assert got.tokens == hf_greedy(tiny_lm.factory(), prompt, 12)
