"""The decode step on a GPU as one CUDA graph: the decode program, the cache write and
the logits, captured once and replayed per token.

A decode step of a small model is hundreds of short kernels; launched one by one from
Python, launch overhead, not memory bandwidth, sets the speed. The step has fixed shapes
(one token, the cache's own buffers), so one capture serves every position: the token
and its position are written into the graph's static inputs before each replay. The
artifact's AOTInductor partitions are loaded with ``run_single_threaded=True`` for this
(runtime.load), as capture requires.
"""

from __future__ import annotations

import torch

WARMUP_STEPS = 3  # lazy initialisation (cuBLAS handles, allocator pools) happens off-graph


class DecodeGraph:
    def __init__(self, generator, device: torch.device) -> None:
        self._generator = generator
        self._tokens = torch.zeros(1, dtype=torch.long, device=device)
        self._position = torch.zeros(1, dtype=torch.long, device=device)
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # position 0: any prompt rewrites that slot first
            for _ in range(WARMUP_STEPS):
                generator.run_step(self._tokens, self._position)
        torch.cuda.current_stream(device).wait_stream(stream)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._logits = generator.run_step(self._tokens, self._position)

    def __call__(self, token: int, position: int) -> torch.Tensor:
        """The logits [1, vocab] after ``token`` at ``position`` (the graph's own buffer,
        overwritten by the next step)."""
        self._tokens.fill_(token)
        self._position.fill_(position)
        self._graph.replay()
        return self._logits
