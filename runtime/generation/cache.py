"""The runtime's KV cache: one preallocated buffer per ``past.*`` input, written in place.

After each step the entry point returns the new tokens' keys and values; ``write`` puts
them in their slots (``position % slots``, runtime/generation/layout.py). A chunk longer
than a ring keeps only its last ``slots`` rows, which are exactly the ones the window can
still see. Nothing is cleared between prompts: the graph masks slots by position. Rows a
step stored in the cache itself come back as views of their slots and are left as they are.

An encoder-decoder's cache also holds the cross-attention keys/values ``encode`` returned
(``cross_*``, fixed buffers of the source bound's rows) and, for a text source,
``source_mask`` (1 on the rows a source fills): ``set_source`` writes them once a source.
"""

from __future__ import annotations

import torch

from runtime.generation.layout import CacheLayout

SOURCE_MASK = "source_mask"


class KvCache:
    def __init__(self, layout: CacheLayout, device: str | torch.device,
                 source_mask: bool = False) -> None:
        self.layout = layout
        dtype = getattr(torch, layout.dtype)
        names = layout.names()
        slot_counts = [layer.slots for layer in layout.layers for _ in "kv"]
        # buffers of one shape are slices of one tensor, so a step's new rows go in with
        # one copy for all layers (``_write_stacked``), not one small kernel per buffer
        alike: dict[tuple, list[tuple[str, str]]] = {}
        for pair, shape, slots in zip(names, layout.shapes(), slot_counts):
            alike.setdefault((tuple(shape), slots), []).append(pair)
        views, self._stacks = {}, []
        for (shape, slots), pairs in alike.items():
            stack = torch.zeros((len(pairs), *shape), dtype=dtype, device=device)
            views.update((past, stack[i]) for i, (past, _) in enumerate(pairs))
            self._stacks.append((stack, [new for _, new in pairs], slots))
        self.buffers = {past: views[past] for past, _ in names}
        self._cross = [(new, torch.zeros(shape, dtype=dtype, device=device))
                       for (_, new), shape in zip(layout.cross_names(), layout.cross_shapes())]
        self.buffers.update((past, buffer) for (past, _), (_, buffer) in
                            zip(layout.cross_names(), self._cross))
        if source_mask:
            rows = layout.cross[0].slots
            self.buffers[SOURCE_MASK] = torch.zeros(1, rows, dtype=torch.long, device=device)
        # (new-rows output name, its buffer, the buffer's slot count, (its first and end
        # address, a slot's bytes)), in layer order: a step that stores its new rows
        # returns them as views, which ``write`` recognises by address (cheap, per layer)
        self._writes = [(new, buffer, buffer_slots, (buffer.data_ptr(),
                                                     buffer.data_ptr() + buffer.nbytes,
                                                     buffer.stride(2) * buffer.element_size()))
                        for (past, new), buffer_slots in zip(names, slot_counts)
                        for buffer in [self.buffers[past]]]

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    def write(self, positions: torch.Tensor, new: dict[str, torch.Tensor]) -> None:
        """Store the rows of ``positions`` (the step's, in order) from the step's outputs."""
        count = positions.shape[0]
        first = None  # the first new position, read once, only when a step stored rows
        slots_of = {}  # one index tensor per ring size, not per buffer (a kernel each)
        done = self._write_stacked(positions, new, slots_of)
        for name, buffer, slots, (base, end, row_bytes) in self._writes:
            if name in done:
                continue
            rows = new.get(name)
            if rows is None:  # stored by the step itself, and left out (run_in_place)
                continue
            pointer = rows.data_ptr()
            if base <= pointer < end:  # a view of this buffer: rows the step stored itself
                if first is None:
                    first = int(positions[0])
                if pointer == base + first % slots * row_bytes and rows.shape[2] == count \
                        and rows.stride() == buffer.stride():
                    continue
            if slots not in slots_of:
                kept = positions[-slots:] if count > slots else positions
                slots_of[slots] = torch.remainder(kept, slots)
            if count > slots:  # a chunk longer than a ring: its last rows survive
                rows = rows[:, :, -slots:]
            buffer.index_copy_(2, slots_of[slots], rows.to(buffer.dtype))

    def _write_stacked(self, positions: torch.Tensor, new: dict[str, torch.Tensor],
                       slots_of: dict) -> set[str]:
        """Each stack whose every buffer got rows the step returned (not rows it stored
        itself): the rows stacked and copied in at once. The names written."""
        done = set()
        count = positions.shape[0]
        for stack, names, slots in self._stacks:
            rows = [new.get(name) for name in names]
            if len(rows) < 2 or any(r is None or _inside(r, stack) for r in rows):
                continue
            if slots not in slots_of:
                kept = positions[-slots:] if count > slots else positions
                slots_of[slots] = torch.remainder(kept, slots)
            if count > slots:  # a chunk longer than a ring: its last rows survive
                rows = [r[:, :, -slots:] for r in rows]
            stack.index_copy_(3, slots_of[slots], torch.stack(rows).to(stack.dtype))
            done.update(names)
        return done

    def set_source(self, encoded: dict[str, torch.Tensor]) -> int:
        """Store what ``encode`` returned for one source (its rows first, the rest zero and
        masked); returns the source's length in rows."""
        length = None
        for name, buffer in self._cross:
            rows = encoded[name]
            length = rows.shape[2]
            buffer[:, :, :length].copy_(rows)
            buffer[:, :, length:].zero_()
        mask = self.buffers.get(SOURCE_MASK)
        if mask is not None:
            mask.zero_()
            mask[:, :length] = 1
        return length


def _inside(rows: torch.Tensor, stack: torch.Tensor) -> bool:
    """Whether ``rows`` are a view into ``stack`` (rows a step stored in the cache)."""
    pointer = rows.data_ptr()
    return stack.data_ptr() <= pointer < stack.data_ptr() + stack.nbytes
