"""A sort's equal keys in one order on every backend (passes/cleanup/stable_sort.py): the
cpu build's ONNX Runtime candidate of an MoE-like router, whose sort of top-2 expert ids is
all ties, passes the check against the partition's own outputs that it failed before."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from passes.cleanup.stable_sort import StableSort
from targets.aoti import choice, timing
from targets.aoti.card import CpuOptions
from targets.aoti.cpu import CpuTarget
from targets.base import LowerOptions


class _Router(torch.nn.Module):
    """Top-2 of 4 experts for 32 tokens, the tokens grouped by expert as transformers' MoE
    layers do: a sort of the 64 expert ids (ties: 4 distinct values), their counts, and
    the tokens' rows gathered in the sort's order."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(8, 4)

    def forward(self, x):
        _, experts = torch.topk(F.softmax(self.gate(x), -1), 2)
        keys, order = torch.sort(experts.reshape(-1))
        counts = torch.histc(keys.float(), bins=4, min=0, max=3)
        return keys, order, x[order // 2], counts.cumsum(0)


def _router_program():
    torch.manual_seed(0)
    x = torch.randn(32, 8)
    return torch.export.export(_Router().eval(), (x,))


def test_the_routers_sort_orders_its_ties_otherwise_than_a_stable_sort_in_eager():
    """The premise: torch's CPU sort past 16 keys is not stable, so the order among equal
    expert ids is the backend's to choose."""
    program = _router_program()
    keys, order = program.module()(*program.example_inputs[0])[:2]
    assert len(set(keys.tolist())) < len(keys)
    assert not torch.equal(order, torch.sort(keys, stable=True).indices)


@pytest.mark.parametrize("descending", [False, True])
def test_every_sort_becomes_stable_and_keeps_its_dim_and_direction(descending):
    class Sorts(torch.nn.Module):
        def forward(self, x):
            return torch.sort(x, dim=0, descending=descending), torch.argsort(x, dim=1)

    x = torch.randint(0, 3, (40, 40)).float()
    program = torch.export.export(Sorts(), (x,))
    result = StableSort()(program)
    targets = [n.target for n in result.program.graph.nodes if n.op == "call_function"]
    assert result.modified and result.info == {"sorts": 2}
    assert torch.ops.aten.sort.default not in targets
    (values, indices), args = result.program.module()(x)
    stable = torch.sort(x, dim=0, descending=descending, stable=True)
    assert torch.equal(values, stable.values) and torch.equal(indices, stable.indices)
    assert torch.equal(args, torch.sort(x, dim=1, stable=True).indices)
    assert StableSort()(result.program).modified is False, "nothing left to change"


def test_the_cpu_builds_onnx_candidate_of_a_router_with_tied_expert_ids_is_kept(tmp_path):
    """The cpu target's passes, then the cpu build's candidate check (timing.mismatch,
    as its timing process runs it): ONNX Runtime's TopK sorts stably, and now so does
    the program the candidate is checked against; before, 'output 1 differs' dropped it."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from runtime.executors import create_executor
    from runtime.format.manifest import Partition

    options = LowerOptions(work_dir=tmp_path, target=CpuOptions(cpu_backend="auto"))
    program = _router_program()
    for step in CpuTarget().default_passes(options):
        program = step(program).program
    onnx = choice.lower_as_onnx(program, options)
    inputs = list(program.example_inputs[0])
    reference = list(program.module()(*inputs))
    partition = Partition(name="onnx", backend="onnxruntime", device="cpu",
                          files=tuple(sorted(onnx.files)), inputs=("input0",),
                          outputs=tuple(f"output{i}" for i in range(len(reference))),
                          meta=onnx.meta)
    run = create_executor(partition, tmp_path, where="candidate onnx")
    problem = timing.mismatch(run(inputs), reference)
    assert problem is None, problem
