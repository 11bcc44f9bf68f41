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
its head's kernel: the graph copies it; a step whose token kernel also wrote it and the
next position into the step's inputs, as the warm-up shows, leaves the graph nothing to
copy or add). Greedy decoding (``greedy``) then enqueues step k + 1 before the host has
read token k: the GPU runs step after step while the host reads, checks and streams the
last token, instead of idling between steps while it waits for the host
(docs/design-notes.md). The graph writes each token into pinned host memory itself, a
slot per position, through that memory's device address: a kernel, not a copy on the
copy engine between two graphs (~9 us a token on an H200), and no step rewrites a slot
the host may still read. A step enqueued after the token that ends generation (eos, a
stop string) only writes that token's cache slot, which the next prompt's prefill writes
again, and its read slot, which no one reads before a later step writes it again.
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
                self._position.fill_(0)
                _, token = generator.run_step_token(self._tokens, self._position)
        torch.cuda.current_stream(device).wait_stream(stream)
        self._advances = _advances(self._tokens, self._position, token)
        # the host reads greedy tokens here: the token at position p in slot p
        self._read = torch.zeros(generator.max_context + 1, dtype=torch.long,
                                 pin_memory=True)
        read = device_view(self._read)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._logits, token = generator.run_step_token(self._tokens, self._position)
            if not self._advances:
                greedy_tail(self._logits, self._tokens, self._position, token)
            read.index_copy_(0, self._position, self._tokens)  # the position advanced
        self._done = [torch.cuda.Event(), torch.cuda.Event()]

    def __call__(self, token: int, position: int) -> torch.Tensor:
        """The logits [1, vocab] after ``token`` at ``position`` (the graph's own buffer,
        overwritten by the next step)."""
        self._check(position, 1)
        self._tokens.fill_(token)
        self._position.fill_(position)
        self._graph.replay()
        return self._logits

    def greedy(self, token: int, position: int, count: int) -> Iterator[int]:
        """The ``count`` greedy tokens after ``token`` at ``position``; each step is
        enqueued before the previous token is read (the caller may stop at any one)."""
        self._check(position, count)
        self._tokens.fill_(token)
        self._position.fill_(position)
        self._enqueue(0)
        for index in range(count):
            if index + 1 < count:
                self._enqueue(index + 1)
            self._done[index % 2].synchronize()
            yield int(self._read[position + 1 + index])

    def _enqueue(self, index: int) -> None:
        self._graph.replay()
        self._done[index % 2].record()  # waited on two steps ago, so free again

    def _check(self, position: int, steps: int) -> None:
        """A step past the context would write a read slot the buffer lacks (a device-side
        assert, which ends the process's CUDA context): refused on the host."""
        if not 0 <= position <= position + steps <= self._read.numel() - 1:
            raise ValueError(f"decode steps at positions {position} to "
                             f"{position + steps - 1} do not fit a context of "
                             f"{self._read.numel() - 1}")


def _advances(tokens: torch.Tensor, position: torch.Tensor,
              token: torch.Tensor | None) -> bool:
    """Whether a step just run at position 0 fed its greedy token and the next position
    back into its own inputs (its head's token kernel: the cuda target's
    Generation.advance_inputs); then the graph copies and adds nothing itself."""
    if int(position) == 0:
        return False
    if token is None or int(position) != 1 or int(tokens.reshape(-1)[0]) != int(token):
        raise RuntimeError("the decode step changed its own inputs other than by feeding "
                           "its greedy token and next position back")
    return True


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


class _Pointer:
    """``__cuda_array_interface__`` for pinned host memory at its own address: with
    unified addressing a pinned buffer's host address is also its device address."""

    def __init__(self, host: torch.Tensor) -> None:
        self.__cuda_array_interface__ = {
            "shape": tuple(host.shape), "strides": None, "version": 2,
            "typestr": {torch.long: "<i8", torch.int32: "<i4"}[host.dtype],
            "data": (host.data_ptr(), False)}


def device_view(host: torch.Tensor) -> torch.Tensor:
    """A CUDA tensor over pinned ``host`` memory (no copy): what a kernel writes there,
    the host reads once the kernel's stream has passed an event after it."""
    view = torch.as_tensor(_Pointer(host), device="cuda")
    if view.data_ptr() != host.data_ptr():  # a copy would never reach the host
        raise RuntimeError("pinned host memory is not addressable from the GPU here")
    return view
