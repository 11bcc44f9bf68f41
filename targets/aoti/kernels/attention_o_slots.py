"""decode_attention_o's flag slots and shape rule (its kernel: attention_o_triton.py),
importable without Triton, for the decode pass that places the op."""

from __future__ import annotations

STRIDE = 32  # int32s between flag slots: each its own 128-byte line
SLOTS = 3


def flag_slots(layers: int) -> list[tuple[int, int]]:
    """(slot, reset) for each layer's launch in order: the slot it counts on and the next
    launch's, which it zeroes; the last layer's next is the next call's first. Two slots,
    a third where the layers are odd, so no two launches in a row share one. A launch
    never zeroes its own slot (a count made before the zeroing would be lost): one layer,
    its own next, zeroes one no launch uses (the call's fill zeroes every slot first)."""
    if layers == 1:
        return [(0, 1)]
    slots = [i % 2 for i in range(layers)]
    if layers % 2:
        slots[-1] = 2
    return [(slots[i], slots[(i + 1) % layers]) for i in range(layers)]


def joins_o(heads: int, dim: int, slots: int) -> bool:
    """The shape rule: o's row is one tile (heads x dim a power of two, at most 4,096)
    and the cache at most 512 slots (the shapes measured)."""
    cols = heads * dim
    return 0 < cols <= 4096 and cols & (cols - 1) == 0 and slots <= 512


def attention_splits(int8: bool) -> int:
    """Blocks of slots a key/value head: 4 (8 over int8 rows), the shapes the 22-layer
    chain measured best at 512 slots (int4 rows take 4: not compared at int4)."""
    return 8 if int8 else 4
