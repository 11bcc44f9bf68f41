"""Timing one call's candidate kernels on the build's GPU, for the passes that choose a
kernel per call shape (attention_kernels.py and the TimedRewrite passes: conv_gemms.py,
depthwise_kernel.py, narrow_convs.py, row_linear_choice.py): each candidate as a CUDA
graph of back-to-back calls, so launch gaps stay out, and a candidate replaces torch's
own choice only when it is clearly faster, not by noise."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from passes.graph.rewrite import replace_calls, rewrite_and_recapture

MARGIN = 0.95  # a candidate replaces torch's choice only under this share of its time
_CALLS, _REPLAYS = 20, 7


def faster(own: float, times: dict[str, float]) -> str | None:
    """The candidate of ``times`` under MARGIN of torch's own choice's time ``own``, or
    None."""
    best = min(times, key=times.get, default=None)
    return best if best and times[best] < MARGIN * own else None


def random_on_gpu(*tensors):
    """Random contiguous GPU tensors of the shapes and dtypes of ``tensors`` (None stays
    None): what a call is timed on."""
    return [None if t is None else torch.randn(t.shape, dtype=t.dtype, device="cuda")
            for t in tensors]


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


def rewrite_chosen(program, choose: Callable, find: Callable, function: Callable,
                   figure: str, extra: Callable = lambda choice: ()):
    """``program`` with each node for which ``find(module, node)`` gives (args, key,
    sample) and ``choose(key, sample)`` a choice as ``function(*args, *extra(choice))``;
    ``info[figure]``: how many."""
    def rewrite(module: torch.fx.GraphModule) -> dict:
        def arguments(node):
            found = find(module, node)
            if found is None:
                return None
            args, key, sample = found
            choice = choose(key, sample)
            return ((*args, *extra(choice)), {}) if choice else None
        return replace_calls(module, arguments, function, figure)
    return rewrite_and_recapture(program, rewrite, figure)


class TimedRewrite:
    """A pass that rewrites the calls its ``rewritten(program, choose)`` finds, each where
    ``pick`` of that call's times says so: ``choose(key, sample)`` times each distinct
    ``key`` once with ``times(*sample)`` (ms a form; ``sample[0]`` the input's example
    value) on the build's GPU and answers ``pick(times, key)``, or None off a GPU. The
    times go to ``info[record]`` in microseconds, under ``label(key)``."""

    name: str
    record: str
    required = False

    def __init__(self, timer: Callable[[Callable], float] | None = None) -> None:
        self.timer = timer or graph_replay_ms

    def __call__(self, program):
        timed: dict = {}

        def choose(key, sample):
            if not self.can_time() or sample[0].device.type != "cuda":
                return None
            if key not in timed:
                timed[key] = self.times(*sample)
            return self.pick(timed[key], key)

        result = self.rewritten(program, choose)
        result.info[self.record] = {self.label(key): {str(k): round(v * 1000, 1)
                                                      for k, v in t.items()}
                                    for key, t in timed.items()}
        return result

    def can_time(self) -> bool:
        return torch.cuda.is_available()

    def times(self, *sample) -> dict:
        raise NotImplementedError

    def pick(self, times: dict, key):
        raise NotImplementedError

    def rewritten(self, program, choose):
        raise NotImplementedError

    def label(self, key) -> str:
        raise NotImplementedError
