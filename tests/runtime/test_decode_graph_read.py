"""How the host reads the decode graph's greedy tokens: from pinned memory that the graph's
own kernel writes, a slot per position (runtime/generation/decode_graph.py)."""

import pytest
import torch

from runtime.generation.decode_graph import DecodeGraph, device_view


def _graph_of_context(context: int) -> DecodeGraph:
    graph = object.__new__(DecodeGraph)  # the bounds only: no GPU, no capture
    graph._read = torch.zeros(context + 1, dtype=torch.long)
    return graph


@pytest.mark.parametrize("position,steps", [(0, 1), (63, 1), (40, 24), (0, 64)])
def test_steps_whose_tokens_have_a_read_slot_pass(position, steps):
    _graph_of_context(64)._check(position, steps)


@pytest.mark.parametrize("position,steps", [(64, 1), (41, 24), (-1, 1), (0, 65)])
def test_a_step_past_the_context_is_refused_on_the_host(position, steps):
    """Its kernel would index past the read buffer: a device-side assert, which ends the
    process's CUDA context, where this is a plain error."""
    with pytest.raises(ValueError, match="do not fit a context of 64"):
        _graph_of_context(64)._check(position, steps)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_kernels_write_through_the_device_view_reaches_the_pinned_host_buffer():
    host = torch.full((5,), -1, dtype=torch.long, pin_memory=True)
    view = device_view(host)
    assert view.is_cuda and view.data_ptr() == host.data_ptr()
    done = torch.cuda.Event()
    view.index_copy_(0, torch.tensor([3], device="cuda"),
                     torch.tensor([812], device="cuda"))
    done.record()
    done.synchronize()
    assert host.tolist() == [-1, -1, -1, 812, -1]
