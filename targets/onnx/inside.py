"""Looking inside an ONNX partition (bisect) and timing its bare session (bench).

``intermediate_values`` is Polygraphy's "mark all": every intermediate the ONNX graph
names after a node of the partition's own program becomes a graph output, and ONNX
Runtime runs that on the given inputs. The exporter compares the values with eager's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from targets.errors import TargetOptionError


def intermediate_values(model_path: Path, wanted: dict[str, torch.dtype], inputs: list
                        ) -> list[tuple[str, str, torch.Tensor]]:
    """(ONNX op type, value name, value) for each value of ``wanted`` (name -> dtype) the
    ONNX graph produces, in graph order. bfloat16 values are skipped (numpy has none)."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(model_path), load_external_data=False)
    produced = [(node.op_type, name) for node in model.graph.node for name in node.output
                if name in wanted and wanted[name] != torch.bfloat16]
    outputs = {o.name for o in model.graph.output}
    for _, name in produced:
        if name not in outputs:
            element = onnx.helper.np_dtype_to_tensor_dtype(
                np.dtype(str(wanted[name]).removeprefix("torch.")))
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, element, None))
    marked = model_path.with_name(model_path.stem + ".marked.onnx")  # beside its external data
    onnx.save(model, str(marked))
    session = ort.InferenceSession(str(marked), providers=["CPUExecutionProvider"])
    feeds = {arg.name: t.detach().cpu().numpy() for arg, t in zip(session.get_inputs(), inputs)}
    names = [name for _, name in produced]
    got = dict(zip(names, session.run(names, feeds)))
    return [(op_type, name, torch.from_numpy(got[name])) for op_type, name in produced]


def direct_session(program, inputs: list[torch.Tensor]) -> Callable:
    """``session.run`` on the artifact's own ONNX Runtime session, with numpy feeds built
    once: same model, providers, threads and inputs, so the difference is what the
    runtime adds. (A second session would double the spinning thread pools on a small
    machine and measure their contention instead.)"""
    partitions = program.manifest.partitions
    session = getattr(program.executors[0], "session", None) if len(partitions) == 1 else None
    if session is None:
        raise TargetOptionError("the onnxruntime baseline needs an onnx artifact with one "
                                "partition", where=program.source,
                                hint="use --baseline eager,compile for this artifact")
    feeds = {arg.name: t.cpu().numpy() for arg, t in zip(session.get_inputs(), inputs)}
    return lambda: session.run(None, feeds)
