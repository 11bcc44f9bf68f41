"""Reading and writing named tensors: ``.npz`` for users, safetensors between processes.

``np.load`` runs with ``allow_pickle=False``: an ``.npz`` is data, never code. An ``.npz``
is read as numpy arrays (a torch Program takes them as tensors; a device without torch
runs on them) and written from tensors or arrays. safetensors carries bfloat16, which
numpy cannot, so the build's validation subprocess exchanges torch tensors through it.
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from runtime.errors import UserInputError
from runtime.host.outfiles import written_whole

if TYPE_CHECKING:
    import torch


# What an inputs .npz may inflate to unless the caller knows better (run_npz bounds it by
# the artifact's signature). Checked from the array headers before any data is read.
MAX_INPUT_BYTES = 8 << 30
_MAX_ARRAYS = 4096
_NUMBER_KINDS = "biufc"  # bool, int, uint, float, complex: what a tensor can hold


def load_npz(path: str | Path, *, max_bytes: int = MAX_INPUT_BYTES) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz``, each C-contiguous. Sizes, dtypes and keys are checked from the
    zip directory and each array's header first: a small file that claims terabytes (or
    inflates to them) is refused before a byte of it is inflated."""
    path = Path(path)
    hint = "write it with numpy.savez(path, name=array, ...), keys = the input names"
    if path.is_dir():
        raise UserInputError(f"the inputs file {path} is a directory", where=str(path), hint=hint)
    if not path.is_file():
        what = "is not a regular file" if path.exists() else "does not exist"  # a FIFO, a device
        raise UserInputError(f"the inputs file {path} {what}", where=str(path), hint=hint)
    try:
        _check_npz_headers(path, max_bytes)
        with np.load(path, allow_pickle=False) as data:
            return {key: np.ascontiguousarray(data[key]) for key in data.files}
    except UserInputError:
        raise
    except (ValueError, OSError, zipfile.BadZipFile, EOFError, TypeError) as exc:
        raise UserInputError(
            f"cannot read {path} as an .npz of arrays ({type(exc).__name__}: {str(exc)[:200]})",
            where=str(path), hint=hint + "; object arrays (pickles) are refused") from exc


def _check_npz_headers(path: Path, max_bytes: int) -> None:
    def refuse(what: str) -> UserInputError:
        return UserInputError(what, where=str(path), hint="write it with numpy.savez(path, "
                              "name=array, ...): numeric arrays only, keys = the input names")

    with open(path, "rb") as fh:
        if fh.read(6) == b"\x93NUMPY":
            raise refuse("this is an .npy file (one array); the inputs are an .npz of named "
                         "arrays")
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        if len(infos) > _MAX_ARRAYS:
            raise refuse(f"the .npz has {len(infos)} members, over the limit of {_MAX_ARRAYS}")
        total, seen = 0, set()
        for info in infos:
            key = info.filename.removesuffix(".npy")
            if key in seen:  # numpy would take the last, a zip viewer shows the first
                raise refuse(f"the .npz holds the array {key!r} twice")
            seen.add(key)
            with zf.open(info) as member:
                version = np.lib.format.read_magic(member)
                read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                        else np.lib.format.read_array_header_2_0)
                shape, _, dtype = read(member)
            if dtype.hasobject or dtype.kind not in _NUMBER_KINDS or dtype.names:
                raise refuse(f"the array {key!r} has dtype {dtype} ({dtype.kind!r}); inputs "
                             "are numbers (bool, int, float, complex)")
            nbytes = math.prod(shape) * dtype.itemsize
            if nbytes > info.file_size:
                raise refuse(f"the array {key!r} claims {nbytes} bytes (shape {shape}) but its "
                             f"member holds {info.file_size}")
            total += nbytes
            if total > max_bytes:
                raise refuse(f"the arrays add up to more than {max_bytes} bytes, the most these "
                             f"inputs can take (at {key!r}, shape {shape})")


def save_npz(path: str | Path, tensors: Mapping[str, Any]) -> None:
    """Torch tensors or numpy arrays, by name."""
    arrays = {}
    for name, tensor in tensors.items():
        if not isinstance(tensor, np.ndarray):  # a torch tensor
            tensor = tensor.detach().cpu()
            if str(tensor.dtype) == "torch.bfloat16":  # numpy has none; widen without loss
                tensor = tensor.float()
            tensor = tensor.numpy()
        arrays[name] = tensor
    # A file object, so numpy writes exactly ``path`` (a name alone gets ".npz" appended),
    # whole or not at all (a full disk leaves the previous outputs in place).
    with written_whole(path) as partial, open(partial, "wb") as fh:
        np.savez(fh, **arrays)


def save_tensors(path: str | Path, tensors: Mapping[str, torch.Tensor]) -> None:
    """safetensors refuses tensors sharing memory (``mha(x, x, x)`` passes one tensor
    three times), so a tensor whose storage was already written is written as a copy."""
    from safetensors.torch import save_file
    seen: set[int] = set()
    flat = {}
    for name, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        storage = tensor.untyped_storage().data_ptr()
        flat[name] = tensor.clone() if storage in seen and tensor.numel() else tensor
        seen.add(storage)
    save_file(flat, str(path))


def load_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    return load_file(str(path))
