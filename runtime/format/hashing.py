"""Hashing what an artifact holds: SHA-256 of a stream while it is copied, and a map over
entries that runs on threads when they are large (hashlib and zlib release the GIL)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

CHUNK = 1 << 20
THREADED_BYTES = 64 << 20  # below this, hashing entries one by one costs less than threads


def hash_stream(chunks: Iterable[bytes], sink: BinaryIO | None = None) -> tuple[str, int]:
    """SHA-256 hex and size of a stream of chunks, optionally copying them into `sink`
    (from the second chunk on, each is hashed on a thread while it is written)."""
    h, size, pending = hashlib.sha256(), 0, None
    with ThreadPoolExecutor(1) as hasher:  # no thread until a second chunk needs one
        for chunk in chunks:
            if sink is None or not size:
                h.update(chunk)
            else:
                if pending is not None:
                    pending.result()
                pending = hasher.submit(h.update, chunk)
            if sink is not None:
                sink.write(chunk)
            size += len(chunk)
        if pending is not None:
            pending.result()
    return h.hexdigest(), size


def each(fn: Callable, items: list, total_bytes: int) -> list:
    """``[fn(item) for item in items]``, on threads when the items are large: hashlib and
    zlib release the GIL on big buffers, so entries hash side by side. Results, and the
    first error, come in the items' order."""
    workers = min(len(items), os.cpu_count() or 1, 8)
    if workers < 2 or total_bytes < THREADED_BYTES:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))
