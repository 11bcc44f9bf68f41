"""Looking inside an ONNX partition (bisect) and timing its bare session (bench).

``intermediate_values`` is Polygraphy's "mark all": every intermediate the ONNX graph
names after a node of the partition's own program becomes a graph output, and ONNX
Runtime runs that on the given inputs. The exporter compares the values with eager's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from passes.graph.rewrite import module_path
from runtime.executors.ort_kernels import register_kernels
from runtime.executors.ort_shared import supply_shared
from targets.errors import TargetOptionError


def intermediate_values(model_path: Path, wanted: dict[str, torch.dtype], inputs: list,
                        shared: dict[str, torch.Tensor] | None = None,
                        kernels: Path | None = None) -> list[tuple[str, str, torch.Tensor]]:
    """(ONNX op type, value name, value) for each value of ``wanted`` (name -> dtype) the
    ONNX graph produces, in graph order. bfloat16 values are skipped (numpy has none).
    ``shared``: the initializers the partition takes from the artifact's shared store;
    ``kernels``: the partition's own kernel library (targets/onnx/kernels)."""
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
    options = _options(ort, kernels, model_path)
    kept = supply_shared(ort, options, shared, in_memory_files=True, partition=model_path.parent.name,
                         where=str(model_path)) if shared else []
    session = ort.InferenceSession(str(marked), options, providers=["CPUExecutionProvider"])
    feeds = {arg.name: t.detach().cpu().numpy() for arg, t in zip(session.get_inputs(), inputs)}
    names = [name for _, name in produced]
    got = dict(zip(names, session.run(names, feeds)))
    del kept  # ORT read the shared tensors' buffers in place until here
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


def node_times(model_path: Path, inputs: list, runs: int, providers=None,
               kernels: Path | None = None) -> list[dict]:
    """Each node's kernel time from ONNX Runtime's own profiler (SessionOptions.
    enable_profiling) over ``runs`` calls on ``inputs``, after a few untimed ones: rows
    ``{node, op, provider, median_ms, calls}``. ``op`` is the kernel ORT ran, after its
    fusions ("FusedGemm" for a Gemm and its Relu); ``node`` the first node of the fusion."""
    import json
    import statistics

    import onnxruntime as ort

    options = _options(ort, kernels, model_path)
    options.enable_profiling = True
    options.profile_file_prefix = str(model_path.parent / "ort-profile")
    usable = [p for p in (providers or []) if p in ort.get_available_providers()]
    session = ort.InferenceSession(str(model_path), options,
                                   providers=usable or ["CPUExecutionProvider"])
    feeds = {arg.name: t.detach().cpu().numpy() for arg, t in zip(session.get_inputs(), inputs)}
    warmup = max(2, runs // 10)
    for _ in range(warmup + runs):
        session.run(None, feeds)
    events = json.loads(Path(session.end_profiling()).read_text())
    durations: dict[str, list[float]] = {}
    kinds: dict[str, tuple[str, str]] = {}
    finished = 0  # model_run events seen: node events of the first `warmup` runs are dropped
    for event in events:
        if event.get("cat") == "Session" and event.get("name") == "model_run":
            finished += 1
        elif (event.get("cat") == "Node" and finished >= warmup
              and event.get("name", "").endswith("_kernel_time")):
            node = event["name"].removesuffix("_kernel_time").removeprefix("fused ")
            durations.setdefault(node, []).append(event["dur"] / 1e3)  # microseconds to milliseconds
            args = event.get("args") or {}
            kinds[node] = (str(args.get("op_name", "")), str(args.get("provider", "")))
    return [{"node": node, "op": kinds[node][0], "provider": kinds[node][1],
             "median_ms": statistics.median(values), "calls": len(values)}
            for node, values in durations.items()]


def _options(ort, kernels: Path | None, model_path: Path):
    """Session options with the partition's own kernels registered, where it has them."""
    options = ort.SessionOptions()
    if kernels is not None:
        register_kernels(options, kernels, model_path.parent.name, str(model_path))
    return options


def graph_nodes(model_bytes: bytes, limit: int) -> list[dict]:
    """The ONNX graph as rows ``{name, op, inputs, outputs, origin}`` (each tensor as
    ``{name, type, weight}``; ``origin``: the ATen node torch.onnx made it from), at most
    ``limit`` nodes. The weights' bytes are not read (external data stays unloaded)."""
    import onnx

    model = onnx.load_model_from_string(model_bytes)
    graph = model.graph
    types = {v.name: _onnx_type(v.type) for v in [*graph.input, *graph.value_info, *graph.output]}
    weights = {t.name: f"{onnx.TensorProto.DataType.Name(t.data_type).lower()}"
                       f"[{', '.join(map(str, t.dims))}]" for t in graph.initializer}
    rows = []
    for node in list(graph.node)[:limit]:
        origin = fx_origin({p.key: p.value for p in node.metadata_props})
        rows.append({"name": node.name, "op": node.op_type, "origin": origin,
                     "inputs": [{"name": i, "type": weights.get(i) or types.get(i, ""),
                                 "weight": i in weights} for i in node.input if i],
                     "outputs": [{"name": o, "type": types.get(o, ""), "weight": False}
                                 for o in node.output if o]})
    return rows


# The module path of the op an ONNX node came from ("model.layers.0.mlp.down_proj"), as a
# node property: quantization reports and bisect name layers by it (torch.onnx's own
# "namespace" holds the class names of the re-captured program's modules, not the user's).
MODULE_KEY = "exporter.module"


def fx_origin(metadata: dict[str, str]) -> str:
    """The name of the ATen node torch.onnx made a node from ("linear_5"), or ""."""
    return metadata.get("pkg.torch.onnx.fx_node", "").split(" ", 1)[0].lstrip("%")


def label_modules(model, program) -> int:
    """Give each node of ``model`` (torch.onnx's IR of ``program``) the module path of the
    ATen node it came from, under ``MODULE_KEY``; how many got one."""
    paths = {node.name: module_path(node) for node in program.graph.nodes}
    labelled = 0
    for node in model.graph:
        path = paths.get(fx_origin(node.metadata_props))
        if path:
            node.metadata_props[MODULE_KEY] = path
            labelled += 1
    return labelled


def _onnx_type(value_type) -> str:
    import onnx
    tensor = value_type.tensor_type
    dims = [str(d.dim_value) if d.HasField("dim_value") else d.dim_param or "?"
            for d in tensor.shape.dim]
    return f"{onnx.TensorProto.DataType.Name(tensor.elem_type).lower()}[{', '.join(dims)}]"
