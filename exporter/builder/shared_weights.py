"""One copy of every weight, however many partitions read it (runtime/shared_weights.py).

Lowerings built with ``LowerOptions.shared_weights`` return their tensors instead of
packaging them; here each tensor is keyed by its content (dtype, shape and bytes), so
the same weight lowered for two entry points, or a tied input embedding and output head,
is one entry of ``weights/shared.safetensors``. Each partition's meta then maps the names
its executor uses to those keys.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors.torch import save_file

from runtime.shared_weights import ENTRY
from runtime.weights import INDEX_KEY, read_index
from targets import Lowered


def share_weights(lowered: list[Lowered], work_dir: Path) -> tuple[dict, dict[str, Path]]:
    """Rewrites each lowered partition's meta; returns the manifest's ``shared_weights``
    record and the store's file ({} and {} when no partition returned weights)."""
    store: dict[str, torch.Tensor] = {}
    for low in lowered:
        if not low.weights:
            continue
        names = {}
        for name, tensor in sorted(low.weights.items()):
            key = content_key(tensor)
            store.setdefault(key, tensor.detach().cpu().contiguous())
            names[name] = key
        low.meta = {**low.meta, "shared_weights": names}
        low.weights = {}
    if not store:
        return {}, {}
    path = work_dir / "shared.safetensors"
    save_file(dict(sorted(store.items())), str(path))
    return {"entry": ENTRY, INDEX_KEY: read_index(path),
            "bytes": sum(t.numel() * t.element_size() for t in store.values())}, {ENTRY: path}


def content_key(tensor: torch.Tensor) -> str:
    """What the tensor holds, not what a graph calls it: equal tensors, one key."""
    data = tensor.detach().cpu().contiguous()
    digest = hashlib.sha256(f"{data.dtype}{tuple(data.shape)}".encode())
    digest.update(data.view(torch.uint8).numpy().data if data.numel() else b"")
    return digest.hexdigest()[:32]
