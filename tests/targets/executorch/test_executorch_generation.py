"""--task text-generation on executorch: prefill and decode as two .pte programs over the
runtime's static KV cache (the cache rows are inputs, the new rows outputs, as on every
target), token for token equal to transformers' greedy generation at fp32. One program
takes 1 to --prefill-chunk tokens and is the decode step too: a .pte holds its own weights."""

from __future__ import annotations

import zipfile

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


def test_remainder_rewrite_edits_the_program_in_place_without_tracing_again():
    """The rewrite re-captured the whole program with torch.export, a tenth of a 300M
    decoder's executorch build; its new nodes have the remainder's shape and dtype, so
    the graph is edited where it is. A remainder that is an output stays one."""
    from targets.executorch.floor_remainder import FloorRemainder
    args = (torch.tensor([-7, -1, 0, 5, 7, 6]), torch.tensor([3, -3, 3, -3, 3, 3]),
            torch.tensor([-7.5, -1.0, 0.0, 5.5, 7.0, 1.0]))
    program = torch.export.export(_Remainders(), args)
    outputs = [s.arg.name for s in program.graph_signature.output_specs]
    result = FloorRemainder()(program)
    assert result.program is program and result.info == {"remainders": 3}  # not re-captured
    assert [s.arg.name for s in program.graph_signature.output_specs] == outputs
    program.validate()  # torch.export's verifier: every new node has its value
    for value, want in zip(program.module()(*args), _Remainders()(*args)):
        assert value.tolist() == want.tolist()


class _Islands(torch.nn.Module):  # linears between ops XNNPACK does not take: 3 delegates
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        return self.c(torch.cumsum(self.b(torch.cumsum(self.a(x), 1)), 1))


def test_delegates_are_cut_out_without_copying_the_program_and_give_the_same_bytes(
        monkeypatch):
    """ExecuTorch cut each XNNPACK delegate out with torch's legalize_graph: a copy and a
    recompile of the whole program per delegate, 80 s of a 300M decoder's 263 delegates.
    The in-place sort puts the nodes in the very same order: the same .pte, byte for byte."""
    import copy

    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import lowered_backend_module, to_edge_transform_and_lower

    from targets.executorch.legalize import delegation_without_copies, legalize_in_place
    program = torch.export.export(_Islands().eval(), (torch.randn(2, 8),))

    def lowered():
        edge = to_edge_transform_and_lower(copy.deepcopy(program),
                                           partitioner=[XnnpackPartitioner()])
        return edge.to_executorch().buffer
    plain = lowered()
    sorted_in_place = []

    def counted(module):
        sorted_in_place.append(module)
        return legalize_in_place(module)
    monkeypatch.setattr("targets.executorch.legalize.legalize_in_place", counted)
    with delegation_without_copies():
        ours = lowered()
    assert len(sorted_in_place) == 3 and ours == plain
    assert lowered_backend_module.legalize_graph.__module__ == "torch.fx.passes.tools_common"


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
    assert {p.backend for p in manifest.partitions} == {"executorch"}
    # the attention's matmuls and the projections inside XNNPACK
    assert sum(p.meta["xnnpack_ops"] for p in manifest.partitions) > 0
    # the Python API's generate, from a fresh load, against transformers' greedy tokens
    from exporter.lm.validate import hf_greedy
    from tests.models import tiny_lm
    prompt = [1, 17, 42, 99, 5, 250, 7, 3, 64, 11]
    got = runtime.load(executorch_lm.artifact).generate(prompt, 12, stop_at_eos=False)
    assert got.tokens == hf_greedy(tiny_lm.factory(), prompt, 12)


@pytest.mark.slow  # shares the module's build
def test_executorch_generating_artifact_holds_its_weights_once(executorch_lm):
    """A .pte carries its weights (XNNPACK packs them per program): a decode program of
    its own beside prefill's was a second copy in the artifact, in memory at run time and
    a second lowering in the build. One program serves both, from one token up."""
    manifest = executorch_lm.manifest
    assert not manifest.entry_points and manifest.source["decode_on_prefill"]
    # the one-token prompt case decoded through that program and matched transformers
    assert manifest.validation["outputs"][0]["prompt_tokens"] == 1
    from tests.models import tiny_lm
    weights = sum(p.numel() * p.element_size() for p in tiny_lm.factory().parameters())
    with zipfile.ZipFile(executorch_lm.artifact) as archive:
        programs = [i.file_size for i in archive.infolist() if i.filename.endswith(".pte")]
    assert len(programs) == 1 and programs[0] < 1.5 * weights
