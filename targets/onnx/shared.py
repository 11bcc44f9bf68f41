"""ONNX models whose weights come from the artifact's shared store (LowerOptions.
shared_weights): each large initializer stays in the graph, declared as external data at a
location no file fills, and the runtime hands ONNX Runtime the store's tensor for it
(``SessionOptions.add_external_initializers``: the buffer is used in place, never read
from disk). Small initializers (scalars, shapes) stay inline: sharing them saves nothing.
"""

from __future__ import annotations

from pathlib import Path

import torch

# Where the graph says the data is. Never a file: the executor supplies every such tensor.
SHARED_LOCATION = "shared-weights"
INLINE_BELOW_BYTES = 1024


def externalize(path: Path) -> dict[str, torch.Tensor]:
    """Rewrite the model at ``path`` (and drop its own external-data files); returns
    {initializer name: tensor} for the initializers now left to the runtime."""
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import uses_external_data

    old_files = {info.location for t in onnx.load(str(path), load_external_data=False)
                 .graph.initializer if uses_external_data(t)
                 for info in [onnx.external_data_helper.ExternalDataInfo(t)]}
    model = onnx.load(str(path))  # with its external data, read into the protos
    weights = {}
    for init in model.graph.initializer:
        array = numpy_helper.to_array(init)
        if array.nbytes < INLINE_BELOW_BYTES:
            continue
        weights[init.name] = torch.from_numpy(array.copy())
        for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data",
                      "uint64_data", "external_data"):
            init.ClearField(field)
        for key, value in (("location", SHARED_LOCATION), ("offset", "0"),
                           ("length", str(array.nbytes))):
            entry = init.external_data.add()
            entry.key, entry.value = key, value
        init.data_location = onnx.TensorProto.EXTERNAL
    for name in old_files:
        (path.parent / name).unlink(missing_ok=True)
    onnx.save_model(model, str(path))
    return weights
