"""The runtime's KV cache writes: buffers of one shape are slices of one tensor, and a
step's new rows go in with one copy for them all, as they went in buffer by buffer."""

from __future__ import annotations

import torch

from runtime.generation.cache import KvCache
from runtime.generation.layout import CacheLayer, CacheLayout


def _layout() -> CacheLayout:
    full = CacheLayer(slots=16, window=None, key_shape=(2, 4), value_shape=(2, 4))
    ring = CacheLayer(slots=4, window=4, key_shape=(2, 4), value_shape=(2, 4))
    return CacheLayout(batch=1, dtype="float32", layers=(full, ring, full, full))


def _rows(cache: KvCache, count: int, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {new: torch.randn(1, 2, count, 4, generator=generator)
            for _, new in cache.layout.names()}


def _expected(layout: CacheLayout, steps: list) -> dict:
    """Each buffer written on its own, slot = position % slots, the last rows winning."""
    buffers = {past: torch.zeros(shape) for (past, _), shape in
               zip(layout.names(), layout.shapes())}
    for positions, rows in steps:
        for (past, new), layer in zip(layout.names(),
                                      [layer for layer in layout.layers for _ in "kv"]):
            for index, position in enumerate(positions.tolist()):
                buffers[past][:, :, position % layer.slots] = rows[new][:, :, index]
    return buffers


def test_layers_of_one_shape_take_a_steps_rows_in_one_copy_as_one_by_one():
    layout = _layout()
    cache = KvCache(layout, "cpu")
    full = [name for name in cache.buffers if name.endswith(("_0", "_2", "_3"))]
    storages = {cache.buffers[name].untyped_storage().data_ptr() for name in full}
    assert len(storages) == 1  # the full layers' buffers are one tensor's slices
    steps = [(torch.arange(0, 6), _rows(cache, 6, 0)),  # a chunk longer than the ring
             (torch.tensor([6]), _rows(cache, 1, 1)), (torch.tensor([7]), _rows(cache, 1, 2))]
    for positions, rows in steps:
        cache.write(positions, rows)
    want = _expected(layout, steps)
    for name, buffer in cache.buffers.items():
        torch.testing.assert_close(buffer, want[name], rtol=0, atol=0)


def test_rows_a_step_stored_itself_are_left_where_they_are():
    cache = KvCache(_layout(), "cpu")
    rows = _rows(cache, 1, 3)
    for (past, new) in cache.layout.names():  # as a kernel that stores its rows returns them
        buffer = cache.buffers[past]
        buffer[:, :, 3:4] = rows[new]
        rows[new] = buffer[:, :, 3:4]
    before = {name: buffer.clone() for name, buffer in cache.buffers.items()}
    cache.write(torch.tensor([3]), rows)
    for name, buffer in cache.buffers.items():
        torch.testing.assert_close(buffer, before[name], rtol=0, atol=0)
