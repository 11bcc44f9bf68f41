"""A greedy decode step whose head's token kernel also feeds the step's next inputs back
(targets/aoti/passes/decode_argmax.py with ``advance``): row_gemv_argmax_advance in place
of the head, given the step's own input ids and positions, which a call leaves holding
the token and the next position; everything it returns is what it returned before (on
the CPU, through the op's reference kernel; the kernel itself:
test_head_argmax_advance.py)."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.passes.decode_kernels import DecodeAttentionAsKernel, RowLinearsAsKernels
from tests.targets.aoti.test_decode_kernels import _captured, _randomised

pytest.importorskip("transformers")

ADVANCE = "edge_exporter.row_gemv_argmax_advance.default"


def _run(program, past, ids, position):
    with torch.no_grad():
        return program.module()(ids, position, *_randomised(past).values())


@pytest.mark.parametrize("flags", [{}, {"store_rows": True},
                                   {"store_rows": True, "attention_o": True}])
def test_the_token_kernel_writes_the_next_inputs_and_returns_what_it_did(flags):
    """Alone, with the rows stored by the attention (which reads the positions), and
    with that attention joined with o as well (the cuda target's other flags)."""
    program, past = _captured("llama", 1, torch.float32, next_token=True)
    attention = DecodeAttentionAsKernel(store_rows=flags.get("store_rows", False))(
        program).program
    joined = flags.get("attention_o", False)
    plain = RowLinearsAsKernels(attention_o=joined)(attention).program
    result = RowLinearsAsKernels(attention_o=joined, advance_inputs=True)(attention)
    assert result.info["inputs_advanced"] == 1 and result.info["argmax_in_head"] == 1
    assert result.info.get("attention_o", 0) == (2 if joined else 0)
    nodes = list(result.program.graph.nodes)
    head = next(n for n in nodes if str(n.target) == ADVANCE or (
        n.args and str(n.args[0]) == ADVANCE))  # as captured, or functionalized
    assert head is not None
    want = _run(plain, past, torch.tensor([[7]]), torch.tensor([9]))
    ids, position = torch.tensor([[7]]), torch.tensor([9])
    got = _run(result.program, past, ids, position)
    assert list(got) == list(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-4)
    assert ids.tolist() == [[int(got["next_token"])]] and position.tolist() == [10]


def test_the_inputs_stay_as_given_unless_the_target_asks():
    program, past = _captured("llama", 1, torch.float32, next_token=True)
    result = RowLinearsAsKernels()(DecodeAttentionAsKernel()(program).program)
    assert "inputs_advanced" not in result.info
    ids, position = torch.tensor([[7]]), torch.tensor([9])
    _run(result.program, past, ids, position)
    assert ids.tolist() == [[7]] and position.tolist() == [9]


def test_a_step_without_its_token_or_a_prompt_chunk_advances_nothing():
    program, _ = _captured("llama", 1)  # no next_token
    result = RowLinearsAsKernels(advance_inputs=True)(DecodeAttentionAsKernel()(program).program)
    assert result.info["inputs_advanced"] == 0


def test_a_reader_of_the_inputs_after_the_head_keeps_them_as_given():
    from targets.aoti.passes.decode_argmax import _advanced_inputs
    graph = torch.fx.Graph()
    ids, positions, past = (graph.placeholder(n) for n in ("ids", "positions", "past"))
    ids.meta["val"] = torch.empty(1, 1, dtype=torch.int64)
    positions.meta["val"] = torch.empty(1, dtype=torch.int64)
    early = graph.call_function(torch.ops.aten.add.Tensor, (positions, 1))
    head = graph.call_function(torch.ops.aten.neg.default, (past,))
    graph.output((early, head))
    module = torch.fx.GraphModule({}, graph)
    assert _advanced_inputs(module, head) == (ids, positions)  # read before the head
    with graph.inserting_after(head):
        graph.call_function(torch.ops.aten.add.Tensor, (ids, 1))  # read after it
    assert _advanced_inputs(module, head) is None


def test_the_flag_is_off_by_default_and_on_for_cuda():
    """Off unless a target turns it on; cuda does (measured faster on a ~1.1B build)."""
    from targets.aoti.cuda import CudaTarget
    from targets.facets.generation import Generation
    assert Generation().advance_inputs is False
    assert CudaTarget.generation.advance_inputs is True
