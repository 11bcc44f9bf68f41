"""CUDA-graph replay around an executor: capture once per input shape, then replay.

Launch overhead dominates small-batch GPU inference; a captured graph replays all
of a model's kernels with one launch. AOTInductor models can be captured only
when loaded with ``run_single_threaded=True`` (otherwise capture fails with
"operation not permitted when stream is capturing"). Inputs are copied into the
graph's static buffers; outputs are the graph's static buffers, which the caller
clones unless it asked for them (they are overwritten by the next replay).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import torch

from runtime.executors.base import Executor

log = logging.getLogger(__name__)

WARMUP_RUNS = 3  # lets lazy initialisation (cuBLAS handles, autotune caches) happen off-graph


class _Captured:
    def __init__(self, execute: Executor, inputs: list[torch.Tensor], device: torch.device
                 ) -> None:
        self.static_inputs = [t.to(device).clone() for t in inputs]
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_RUNS):
                execute(self.static_inputs)
        torch.cuda.current_stream(device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):  # a private memory pool per graph
            self.static_outputs = execute(self.static_inputs)

    def replay(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        for static, given in zip(self.static_inputs, inputs):
            static.copy_(given, non_blocking=True)
        self.graph.replay()
        return self.static_outputs


class GraphReplay:
    """An Executor around another: one graph per seen input-shape tuple, at most
    ``max_graphs`` (least recently used go)."""

    def __init__(self, execute: Executor, device: str = "cuda", max_graphs: int = 8,
                 static_outputs: bool = False) -> None:
        self.execute = execute
        self.device = torch.device(device)
        self.max_graphs = max_graphs
        self.static_outputs = static_outputs
        self.graphs: OrderedDict[tuple, _Captured] = OrderedDict()

    @property
    def arena_slots(self) -> int:
        return self.execute.arena_slots

    def report(self) -> dict:
        """The wrapped executor's: replaying its kernels changes nothing it reported."""
        return self.execute.report()

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        key = tuple(tuple(t.shape) for t in inputs)
        captured = self.graphs.get(key)
        if captured is None:
            captured = _Captured(self.execute, inputs, self.device)
            self.graphs[key] = captured
            if len(self.graphs) > self.max_graphs:
                self.graphs.popitem(last=False)
            log.debug("captured a CUDA graph for shapes %s (%d cached)", key, len(self.graphs))
        else:
            self.graphs.move_to_end(key)
        outputs = captured.replay(inputs)
        return outputs if self.static_outputs else [t.clone() for t in outputs]
