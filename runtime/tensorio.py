"""Reading and writing named tensors: ``.npz`` for users, safetensors between processes.

``np.load`` runs with ``allow_pickle=False``: an ``.npz`` is data, never code.
safetensors carries bfloat16, which numpy cannot, so the build's validation
subprocess exchanges tensors through it.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Mapping

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from runtime.errors import UserInputError


def load_npz(path: str | Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"the inputs file {path} does not exist", where=str(path),
                             hint="give an .npz written with numpy.savez, keys = input names")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {key: torch.from_numpy(np.ascontiguousarray(data[key])) for key in data.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise UserInputError(
            f"cannot read {path} as an .npz of arrays ({type(exc).__name__}: {exc})",
            where=str(path), hint="write it with numpy.savez(path, name=array, ...); "
            "object arrays (pickles) are refused") from exc


def save_npz(path: str | Path, tensors: Mapping[str, torch.Tensor]) -> None:
    arrays = {}
    for name, tensor in tensors.items():
        tensor = tensor.detach().cpu()
        if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16; widen without loss
            tensor = tensor.float()
        arrays[name] = tensor.numpy()
    np.savez(path, **arrays)


def save_tensors(path: str | Path, tensors: Mapping[str, torch.Tensor]) -> None:
    """safetensors refuses tensors sharing memory (``mha(x, x, x)`` passes one tensor
    three times), so a tensor whose storage was already written is written as a copy."""
    seen: set[int] = set()
    flat = {}
    for name, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        storage = tensor.untyped_storage().data_ptr()
        flat[name] = tensor.clone() if storage in seen and tensor.numel() else tensor
        seen.add(storage)
    save_file(flat, str(path))


def load_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))
