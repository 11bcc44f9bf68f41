"""The decode step on a GPU as one CUDA graph: the decode program, the cache write and
the logits, captured once and replayed per token.

A decode step of a small model is hundreds of short kernels; launched one by one from
Python, launch overhead, not memory bandwidth, sets the speed. The step has fixed shapes
(one token, the cache's own buffers), so one capture serves every position: the token
and its position are written into the graph's static inputs before each replay. The
artifact's AOTInductor partitions are loaded with ``run_single_threaded=True`` for this
(runtime.load), as capture requires.

The graph also takes the logits' argmax as the next token and advances the position, in
its own inputs (a step that returns its greedy token, ``NEXT_TOKEN``, took that argmax in
its head's kernel: the graph copies it). Greedy decoding (``greedy``) then enqueues step k + 1 before the host has
read token k: the GPU runs step after step while the host reads, checks and streams the
last token, instead of idling between steps while it waits for the host
(docs/design-notes.md). A step enqueued after the token
that ends generation (eos, a stop string) only writes that token's cache slot, which the
next prompt's prefill writes again.
"""

from __future__ import annotations

from collections.abc import Iterator

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
            self._logits, token = generator.run_step_token(self._tokens, self._position)
            greedy_tail(self._logits, self._tokens, self._position, token)
        # the host reads greedy tokens here: two slots, one being written while the other
        # is read (pinned, so the copy is asynchronous)
        self._read = torch.zeros(2, dtype=torch.long, pin_memory=True)
        self._done = [torch.cuda.Event(), torch.cuda.Event()]

    def __call__(self, token: int, position: int) -> torch.Tensor:
        """The logits [1, vocab] after ``token`` at ``position`` (the graph's own buffer,
        overwritten by the next step)."""
        self._tokens.fill_(token)
        self._position.fill_(position)
        self._graph.replay()
        return self._logits

    def greedy(self, token: int, position: int, count: int) -> Iterator[int]:
        """The ``count`` greedy tokens after ``token`` at ``position``; each step is
        enqueued before the previous token is read (the caller may stop at any one)."""
        self._tokens.fill_(token)
        self._position.fill_(position)
        self._enqueue(0)
        for index in range(count):
            if index + 1 < count:
                self._enqueue(index + 1)
            self._done[index % 2].synchronize()
            yield int(self._read[index % 2])

    def _enqueue(self, index: int) -> None:
        slot = index % 2  # read two steps ago, so free again
        self._graph.replay()
        self._read[slot:slot + 1].copy_(self._tokens, non_blocking=True)
        self._done[slot].record()


def greedy_tail(logits: torch.Tensor, tokens: torch.Tensor, position: torch.Tensor,
                token: torch.Tensor | None = None) -> None:
    """The greedy next step's input, in the graph: the last row's argmax (the first of
    equal maxima) into ``tokens``, the position advanced. ``token``: that argmax as the
    step returned it (its head's kernel took it), copied in: a copy kernel, not a
    reduction over the vocabulary."""
    if token is not None:
        tokens.copy_(token)
    else:
        torch.argmax(logits[-1:], -1, out=tokens)  # straight into tokens: no copy kernel
    position.add_(1)
