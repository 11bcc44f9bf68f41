"""A model's stored tensors without loading them all: a 1.1B decoder's fp32 ONNX file
holds 4.4 GB of weights, and each whole-model copy the quantizer held (a full load, a
ModelProto copy, a byte count through numpy) took the build past the machine's memory.
Here a model is read as its graph alone (``onnx.load(..., load_external_data=False)``)
and a tensor's values are read from its file only when a rewrite needs them.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def values(tensor, folder: Path | None) -> np.ndarray:
    """The tensor's values: from the proto, or mapped from its external file in
    ``folder``, copy-on-write (pages read as used, in the page cache rather than the
    heap; a write stays private). The proto is left as it was."""
    from onnx import helper, numpy_helper
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    if not uses_external_data(tensor):
        return numpy_helper.to_array(tensor)
    if folder is None:
        raise ValueError(f"tensor {tensor.name!r} is kept in a file: pass its folder")
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    count = int(np.prod(tensor.dims, dtype=np.int64))
    if count == 0 or nbytes(tensor) != count * dtype.itemsize:  # empty; sub-byte, packed
        import onnx_ir as ir
        return ir.serde.deserialize_tensor(tensor, base_path=str(folder)).numpy()
    info = ExternalDataInfo(tensor)
    return np.memmap(Path(folder) / info.location, dtype=dtype, mode="c",
                     offset=info.offset or 0, shape=(count,)).reshape(tuple(tensor.dims))


def nbytes(tensor) -> int:
    """Bytes of the tensor's values, from its type and shape alone (sub-byte types
    packed, as stored)."""
    import onnx_ir as ir

    count = int(np.prod(tensor.dims, dtype=np.int64))
    if tensor.data_type == ir.DataType.STRING:
        return sum(len(s) for s in tensor.string_data)
    return -(-count * ir.DataType(tensor.data_type).bitwidth // 8)


def external_files(model) -> list[str]:
    """File names the model keeps weights in (relative to the model's folder)."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data
    return sorted({ExternalDataInfo(t).location for t in model.graph.initializer
                   if uses_external_data(t)})


def save_graph_only(model, path: Path) -> None:
    """Save ``model`` to ``path``, each tensor still in memory written to ``<name>.data``
    beside it; in place, so the proto keeps the graph alone and copying it is cheap.
    Tensors already external keep their files: ``path`` must share their folder."""
    import onnx
    onnx.save_model(model, str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=path.name + ".data")


def move_files(names: list[str], source: Path, target: Path) -> None:
    """Rename the named files from ``source`` into ``target`` (one file system)."""
    for name in names:
        os.replace(source / name, target / name)
