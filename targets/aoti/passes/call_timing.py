"""Timing one call's candidate kernels on the build's GPU, for the passes that choose a
kernel per call shape (attention_kernels.py, conv_gemms.py): each candidate as a CUDA
graph of back-to-back calls, so launch gaps stay out, and a candidate replaces torch's
own choice only when it is clearly faster, not by noise."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

MARGIN = 0.95  # a candidate replaces torch's choice only under this share of its time
_CALLS, _REPLAYS = 20, 7


def faster(own: float, times: dict[str, float]) -> str | None:
    """The candidate of ``times`` under MARGIN of torch's own choice's time ``own``, or
    None."""
    best = min(times, key=times.get, default=None)
    return best if best and times[best] < MARGIN * own else None


def graph_replay_ms(call: Callable) -> float:
    """Median milliseconds of one ``call`` in a CUDA graph of back-to-back calls."""
    call()  # plans and workspaces made outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(_CALLS):
            call()
    graph.replay()
    times = []
    for _ in range(_REPLAYS):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / _CALLS)
    return statistics.median(times)
