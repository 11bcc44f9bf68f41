"""ONNX models whose weights come from the artifact's shared store (LowerOptions.
shared_weights): each large initializer stays in the graph, declared as external data in a
file of its own that no artifact holds (``shared_location``), and the runtime supplies that
file's bytes from the store, which ONNX Runtime reads in place
(runtime/executors/ort_shared.py). Small initializers (scalars, shapes) stay inline:
sharing them saves nothing.
"""

from __future__ import annotations

from pathlib import Path

import torch

from runtime.executors.ort_shared import shared_location
from targets.onnx.initializers import external_files, nbytes, values

INLINE_BELOW_BYTES = 1024


def externalize(path: Path) -> dict[str, torch.Tensor]:
    """Rewrite the model at ``path`` (and drop its own external-data files); returns
    {initializer name: tensor} for the initializers now left to the runtime: tensors
    over the old files' pages (initializers.values), which stay readable once the files
    are unlinked, so a 4.4 GB model is not read into the heap, twice, to be stored."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    old_files = external_files(model)
    weights = {}
    for init in model.graph.initializer:
        if nbytes(init) < INLINE_BELOW_BYTES:
            continue
        weights[init.name] = _torch_tensor(values(init, path.parent))
        for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data",
                      "uint64_data", "external_data"):
            init.ClearField(field)
        for key, value in (("location", shared_location(init.name)), ("offset", "0"),
                           ("length", str(nbytes(init)))):
            entry = init.external_data.add()
            entry.key, entry.value = key, value
        init.data_location = onnx.TensorProto.EXTERNAL
    for name in old_files:
        (path.parent / name).unlink(missing_ok=True)
    onnx.save_model(model, str(path))
    return weights


def _torch_tensor(array) -> torch.Tensor:
    """numpy to torch; bfloat16 (ml_dtypes' numpy type, which torch.from_numpy refuses)
    through its 16-bit pattern."""
    if not array.flags.writeable:  # torch wants a buffer it may write
        array = array.copy()
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view("uint16")).view(torch.bfloat16)
    return torch.from_numpy(array)
