"""The runtime's KV cache: one preallocated buffer per ``past.*`` input, written in place.

After each step the entry point returns the new tokens' keys and values; ``write`` puts
them in their slots (``position % slots``, runtime/generation/layout.py). A chunk longer
than a ring keeps only its last ``slots`` rows, which are exactly the ones the window can
still see. Nothing is cleared between prompts: the graph masks slots by position.
"""

from __future__ import annotations

import torch

from runtime.generation.layout import CacheLayout


class KvCache:
    def __init__(self, layout: CacheLayout, device: str | torch.device) -> None:
        self.layout = layout
        dtype = getattr(torch, layout.dtype)
        names = layout.names()
        self.buffers = {past: torch.zeros(shape, dtype=dtype, device=device)
                        for (past, _), shape in zip(names, layout.shapes())}
        # (new-rows output name, its buffer, the buffer's slot count), in layer order
        self._writes = [(new, self.buffers[past], buffer_slots)
                        for (past, new), buffer_slots in
                        zip(names, [layer.slots for layer in layout.layers for _ in "kv"])]

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    def write(self, positions: torch.Tensor, new: dict[str, torch.Tensor]) -> None:
        """Store the rows of ``positions`` (the step's, in order) from the step's outputs."""
        count = positions.shape[0]
        slots_of = {}  # one index tensor per ring size, not per buffer (a kernel each)
        for slots in {slots for _, _, slots in self._writes}:
            kept = positions[-slots:] if count > slots else positions
            slots_of[slots] = torch.remainder(kept, slots)
        for name, buffer, slots in self._writes:
            rows = new[name]
            if count > slots:  # a chunk longer than a ring: its last rows survive
                rows = rows[:, :, -slots:]
            buffer.index_copy_(2, slots_of[slots], rows.to(buffer.dtype))
