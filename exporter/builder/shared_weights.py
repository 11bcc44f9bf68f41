"""One copy of every weight, however many partitions read it (runtime/memory/shared_weights.py).

Lowerings built with ``LowerOptions.shared_weights`` return their tensors instead of
packaging them; here each tensor is keyed by its content (dtype, shape and bytes), so
the same weight lowered for two entry points, or a tied input embedding and output head,
is one tensor of ``weights/shared-NNNNN.safetensors`` (shards of at most 1 GiB). Each partition's meta then maps the names
its executor uses to those keys.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors.torch import save_file

from runtime.format.weights import read_index
from runtime.memory.shared_weights import SHARD_BYTES, shard_entry
from targets import Lowered


def share_weights(lowered: list[Lowered], work_dir: Path) -> tuple[dict, dict[str, Path]]:
    """Rewrites each lowered partition's meta; returns the manifest's ``shared_weights``
    record and the store's file ({} and {} when no partition returned weights)."""
    store: dict[str, torch.Tensor] = {}
    for low in lowered:
        if not low.weights:
            continue
        items, names = sorted(low.weights.items()), {}
        # one host copy per tensor, hashed for its key (hashlib releases the GIL) and kept
        # if new; a few at a time, so a partition repeating the store costs no second copy
        workers = min(8, os.cpu_count() or 1)
        with ThreadPoolExecutor(workers) as pool:
            for start in range(0, len(items), workers):
                batch = items[start:start + workers]
                hosts = [tensor.detach().cpu().contiguous() for _, tensor in batch]
                for (name, _), key, host in zip(batch, pool.map(content_key, hosts), hosts):
                    store.setdefault(key, host)
                    names[name] = key
        low.meta = {**low.meta, "shared_weights": names}
        low.weights = {}
    if not store:
        return {}, {}
    files, indexes = {}, {}
    for number, shard in enumerate(_shards(store), start=1):
        entry = shard_entry(number)
        path = work_dir / entry.rsplit("/", 1)[-1]
        save_file(shard, str(path))
        files[entry], indexes[entry] = path, read_index(path)
    return {"entries": indexes,
            "bytes": sum(t.numel() * t.element_size() for t in store.values())}, files


def _shards(store: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Consecutive runs of the sorted keys, each at most SHARD_BYTES (a bigger tensor is
    a shard alone): an artifact entry stays under the loader's per-entry limit."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, tensor in sorted(store.items()):
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][key] = tensor
        size += nbytes
    return shards


def content_key(tensor: torch.Tensor) -> str:
    """What the tensor holds, not what a graph calls it: equal tensors, one key."""
    data = tensor.detach().cpu().contiguous()
    digest = hashlib.sha256(f"{data.dtype}{tuple(data.shape)}".encode())
    digest.update(data.reshape(-1).view(torch.uint8).numpy().data if data.numel() else b"")
    return digest.hexdigest()[:32]
