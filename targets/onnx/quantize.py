"""--quantize for target ``onnx``: ONNX Runtime's own quantization tools on the exported
model (PT2E's quantizers target Inductor; ORT's tools write the int8 ops and QDQ pairs its
kernels fuse). Imported only when an onnx build quantizes.

The report has the same shape as the PT2E pass's (passes/quantize/quantize.py): recipe, layers
quantized, layers left in float with why, weight bytes before and after.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from pathlib import Path
from typing import Callable

import torch

from passes.quantize.quant_error import ErrorSums, layer_rows
from targets import cpu_isa
from targets.onnx.quant_rewrites import (gemms_as_matmuls, pools_counting_only_the_input,
                                        quantize_embedding_tables, untie_output_projections)
from targets.errors import TargetOptionError
from targets.onnx import initializers
from targets.onnx.card import NBITS_BLOCK, RECIPES
from targets.onnx.inside import MODULE_KEY

log = logging.getLogger(__name__)
_WEIGHTED = {"MatMul", "Gemm", "Conv"}
# ORT's advice: dynamic quantization for transformers and RNNs, static for CNNs. Its
# ConvInteger has no fast CPU kernel (the zoo CNN ran many times slower than fp32), so
# int8-dynamic leaves convolutions in float and says why.
DYNAMIC_OP_TYPES = ["MatMul", "Gather", "Attention", "LSTM", "GRU"]
_WHY_FLOAT = {
    ("int8-dynamic", "Conv"): "int8-dynamic keeps convolutions in float on ONNX Runtime "
                              "(ConvInteger is slow); use int8-static for CNNs",
    ("int8-dynamic", "Gemm"): "ONNX Runtime's dynamic quantizer has no int8 Gemm; a "
                              "MatMul-shaped layer (3-D input) is quantized",
}
_INT8_OPS = {"MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv", "DynamicQuantizeMatMul",
             "MatMulNBits"}


class _Calibration:
    """ORT's CalibrationDataReader protocol over our flat input sets."""

    def __init__(self, names: list[str], sets: list) -> None:
        self._feeds = iter([{n: t.numpy() for n, t in zip(names, flat)} for flat in sets])

    def get_next(self):
        return next(self._feeds, None)


def quantize_model(path: Path, recipe: str, calibration: list, examples: list | None = None,
                   block: int | None = None, platform: str = "linux-x86_64"):
    """(the quantized ModelProto, with its weights loaded, and the report). ORT writes to
    a scratch folder; the caller saves the model under the artifact's own file names.
    ``examples``: flat input sets (the partition's own inputs) the per-layer error is
    measured on when there is no calibration data. ``block``: weights per scale of the
    ``-weight`` recipes (None: the recipe's, card.NBITS_BLOCK). ``platform``: where the
    artifact runs (its int8 weights' range, ``seven_bit_weights``). The exported model's
    weights are read from its files as each step needs them, never held whole
    (initializers.py)."""
    import onnx

    with tempfile.TemporaryDirectory(prefix="ort-quantize-", dir=path.parent) as folder:
        scratch = Path(folder)
        before = onnx.load(str(path), load_external_data=False)
        # the export's weight files move in while this runs, so each model written here
        # reads the weights it leaves alone from them, by their own relative names
        exported = initializers.external_files(before)
        initializers.move_files(exported, path.parent, scratch)
        try:
            return _quantize_in(scratch, before, recipe, calibration, examples or [],
                                block or NBITS_BLOCK.get(recipe, 0),
                                seven_bit_weights(platform))
        finally:
            initializers.move_files(exported, scratch, path.parent)


def seven_bit_weights(platform: str) -> bool:
    """Whether int8 weights keep to 7 bits (ORT's ``reduce_range``): with 8 an MLP drifted
    to SQNR 11.7 dB on an AVX2-only CPU, 32.0 with 7."""
    return cpu_isa.int8_pairs_may_saturate(platform)


def _quantize_in(scratch: Path, before, recipe: str, calibration: list, examples: list,
                 block: int, reduce_range: bool):
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    bytes_before = _initializer_bytes(before)
    untie_output_projections(before, scratch)  # a tied head gets its own table to quantize
    # every weight in a file from here on: the protos below are graphs, cheap to copy
    initializers.save_graph_only(before, scratch / "float.onnx")
    # ORT's quantizer re-runs ONNX shape inference, which refused the exporter's own
    # intermediate shapes on the zoo CNN ("Inferred shape and existing shape differ"):
    # it infers them again from the inputs instead.
    plain = onnx.ModelProto()
    plain.CopyFrom(before)
    del plain.graph.value_info[:]
    if recipe.endswith("-weight"):
        gemms_as_matmuls(plain, scratch)
    if recipe == "int8-static":  # before ORT: its QDQ pools run as its int8 kernel
        pools = pools_counting_only_the_input(plain)
        log.info("%d average pool(s) count only what their windows cover", len(pools))
    source, quantized_path = scratch / "plain.onnx", scratch / "quantized.onnx"
    initializers.save_graph_only(plain, source)
    del plain
    with _without_preprocessing_advice():
        _run_ort(source, quantized_path, recipe, calibration, before, block, reduce_range)
    after = onnx.load(str(quantized_path), load_external_data=False)
    weighted, label = _weighted_nodes(before), _layer_labels(before)
    done = _quantized_nodes(after)
    # A Gemm is quantized as MatMul + Add, "<gemm>_MatMul" (ORT's dynamic quantizer
    # rewrites it so; quant_rewrites.gemms_as_matmuls for MatMulNBits)
    quantized = [n for n in weighted if n in done or f"{n}_MatMul" in done]  # graph order
    tables = (quantize_embedding_tables(after, block, scratch) if recipe.endswith("-weight")
              else _gathers_made_int8(before, after))
    quantized += [n for n, how in tables.items() if how == "int8"]
    sets, on = ((calibration, f"{len(calibration)} calibration set(s)") if calibration
                else (examples, "the example inputs"))
    try:  # a diagnostic: the build goes on without it, and says why
        errors = _layer_errors(before, after, quantized, sets, scratch, label) if sets else []
    except Exception as exc:  # noqa: BLE001 - ORT raises its own pybind types
        errors, on = [], f"not computed ({type(exc).__name__}: {str(exc)[:200]})"
    load_external_data_for_model(after, str(scratch))  # the result's own bytes, once
    return after, {
        "recipe": recipe, "how": RECIPES[recipe],
        **({"block_size": block} if recipe.endswith("-weight") else
           {"weight_bits": 7 if reduce_range else 8}),
        "calibration_sets": len(calibration) if recipe == "int8-static" else 0,
        "layers_quantized": [label(n) for n in quantized],
        "layers_float": [{"layer": label(n), "op": op, "why": _WHY_FLOAT.get(
                             (recipe, op), "ONNX Runtime's quantizer left it in float")}
                         for n, op in weighted.items() if n not in quantized]
                        + [{"layer": label(n), "op": "Gather", "why": why}
                           for n, why in tables.items() if why != "int8"],
        "weight_bytes_before": bytes_before,
        "weight_bytes_after": _initializer_bytes(after),
        "layer_errors": errors, "layer_errors_on": on if sets else "no inputs to run on"}


def _run_ort(path: Path, quantized_path: Path, recipe: str, calibration: list, before,
             block: int, reduce_range: bool) -> None:
    from onnxruntime import quantization as ortq

    # DefaultTensorType: ONNX shape inference gives no type to the outputs of ONNX
    # Runtime's own ops (SimplifiedLayerNormalization, GroupQueryAttention: the decoders'
    # fusions), and the quantizer then refused the MatMul after them ("Unable to find
    # data type for weight_name"). Such an output has the model's float type.
    common = {"per_channel": True, "weight_type": ortq.QuantType.QInt8,
              "reduce_range": reduce_range,
              "use_external_data_format": True,  # weights of any size; loaded back whole
              "extra_options": {"DefaultTensorType": _float_type(before)}}
    if recipe.endswith("-weight"):
        _run_nbits(path, quantized_path, bits=4 if recipe == "int4-weight" else 8, block=block)
    elif recipe == "int8-dynamic":
        ortq.quantize_dynamic(str(path), str(quantized_path),
                              op_types_to_quantize=DYNAMIC_OP_TYPES, **common)
    else:
        names = [i.name for i in before.graph.input]
        if not calibration or len(calibration[0]) != len(names):
            raise TargetOptionError(
                "int8-static on target onnx calibrates a partition on the model's own inputs; "
                f"this partition takes {len(names)} input(s) that are not the model's",
                hint="build with --quantize int8-dynamic, or make every op run in one "
                     "partition (--fallback forbid shows which ops break it up)")
        ortq.quantize_static(str(path), str(quantized_path), _Calibration(names, calibration),
                             quant_format=ortq.QuantFormat.QDQ,
                             activation_type=ortq.QuantType.QInt8, **common)


class _QuantizerAdvice(logging.Filter):
    """ONNX Runtime's quantizer warns, on the root logger, to run its pre-processing script
    first, and of each tensor whose type it did not infer (an ONNX Runtime op's output,
    which DefaultTensorType types): advice to whoever wrote the ONNX file, which is us."""

    _SAID = ("pre-processing before quantization", "Failed to infer data type of tensor")

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(said in record.getMessage() for said in self._SAID)


@contextlib.contextmanager
def _without_preprocessing_advice():
    advice = _QuantizerAdvice()
    root = logging.getLogger()
    root.addFilter(advice)
    try:
        yield
    finally:
        root.removeFilter(advice)


def _float_type(model) -> int:
    """The ONNX element type of the model's first floating-point output (float32 if none)."""
    import onnx
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
              onnx.TensorProto.DOUBLE)
    return next((o.type.tensor_type.elem_type for o in model.graph.output
                 if o.type.tensor_type.elem_type in floats), onnx.TensorProto.FLOAT)


def _run_nbits(path: Path, quantized_path: Path, *, bits: int, block: int) -> None:
    import onnx
    from onnxruntime.quantization import matmul_nbits_quantizer as nbits

    config = nbits.DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=True,
                                                accuracy_level=4, bits=bits)
    quantizer = nbits.MatMulNBitsQuantizer(onnx.load(str(path), load_external_data=False),
                                           algo_config=config)
    # ORT reads each weight through onnx_ir, relative to the working directory: from the
    # model's folder, mapped one at a time, where a whole load held every weight first
    with contextlib.chdir(path.parent):
        quantizer.process()
    quantizer.model.save_model_to_file(str(quantized_path), use_external_data_format=True)


def _gathers_made_int8(before, after) -> dict[str, str]:
    """{Gather name: "int8"} for the tables ORT's own quantizers stored as int8 (its
    dynamic quantizer's Gather reads the int8 table and dequantizes the rows), so the
    report names them as it names the weight-only recipes' tables."""
    from onnx import TensorProto as T
    floats = {t.name for t in before.graph.initializer
              if t.data_type in (T.FLOAT, T.FLOAT16, T.BFLOAT16)}
    eight = {t.name for t in after.graph.initializer if t.data_type in (T.UINT8, T.INT8)}
    was_float = {n.name for n in before.graph.node if n.op_type == "Gather" and n.input[0] in floats}
    return {n.name: "int8" for n in after.graph.node
            if n.op_type == "Gather" and n.name in was_float and n.input[0] in eight}


def _layer_errors(before, after, layers: list[str], input_sets: list, scratch: Path,
                  label: Callable[[str], str]) -> list[dict]:
    """Each quantized layer's output (the tensor the float node wrote: ORT's replacement
    writes the same name) in the quantized model against the float model's, over the
    input sets (passes/quantize/quant_error.py's measure, as the PT2E pass reports it)."""
    ops = {n.name: (n.output[0], n.op_type) for n in before.graph.node if n.name in layers}
    values = [ops[name][0] for name in layers]
    sums: dict[str, ErrorSums] = {}
    reference, _mapped = _marked_session(before, values, scratch, "float-marked", mapped=True)
    quantized, _ = _marked_session(after, values, scratch, "int8-marked")
    for flat in input_sets:
        feeds = {arg.name: t.detach().cpu().numpy()
                 for arg, t in zip(reference.get_inputs(), flat)}
        want = dict(zip(values, reference.run(values, feeds)))
        got = dict(zip(values, quantized.run(values, feeds)))
        for name in layers:
            value = ops[name][0]
            if want[value].shape == got[value].shape:
                sums.setdefault(name, ErrorSums()).add(torch.from_numpy(got[value]),
                                                      torch.from_numpy(want[value]))
    return layer_rows(sums, {name: (label(name), ops[name][1]) for name in layers})


def _layer_labels(model) -> Callable[[str], str]:
    """A node's name in reports: "model.layers.0.mlp.down_proj:node_linear_6", the module
    it came from first where the export labelled it (inside.label_modules)."""
    modules = {node.name: prop.value for node in model.graph.node
               for prop in node.metadata_props if prop.key == MODULE_KEY}
    return lambda name: f"{modules[name]}:{name}" if name in modules else name


def _marked_session(model, values: list[str], folder: Path, stem: str, mapped: bool = False):
    """(an ONNX Runtime session of ``model`` with ``values`` made graph outputs, the
    buffers it reads). ``mapped``: its weights read in place from their files, mapped
    (page cache, not heap) and not prepacked, where a session held its own copy of every
    float weight: 4.4 GB beside a 1.1B decoder's build."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from runtime.executors.ort_shared import can_read_files_in_place, read_files_in_place

    marked = onnx.ModelProto()
    marked.CopyFrom(model)
    outputs = {o.name for o in marked.graph.output}
    marked.graph.output.extend(onnx.helper.make_empty_tensor_value_info(v)
                               for v in values if v not in outputs)
    path = folder / f"{stem}.onnx"
    onnx.save_model(marked, str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=f"{stem}.onnx.data")
    options, files = ort.SessionOptions(), {}
    if mapped and can_read_files_in_place(options):
        files = {name: np.memmap(folder / name, dtype=np.uint8, mode="r")
                 for name in initializers.external_files(marked)}
        read_files_in_place(options, files)
        options.add_session_config_entry("session.disable_prepacking", "1")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]), files


def _weighted_nodes(model) -> dict[str, str]:
    """MatMul/Gemm/Conv nodes whose second input is a stored weight: name -> op type."""
    weights = {t.name for t in model.graph.initializer}
    return {n.name: n.op_type for n in model.graph.node
            if n.op_type in _WEIGHTED and len(n.input) > 1 and n.input[1] in weights}


def _quantized_nodes(model) -> set[str]:
    """Original node names that now run in int8: ORT names its replacements after them
    (``<name>_quant``) or, in QDQ format, keeps the node and dequantizes its weight."""
    producers = {out: n for n in model.graph.node for out in n.output}
    names = set()
    for node in model.graph.node:
        if node.op_type in _INT8_OPS:  # ORT names them <name>_quant, MatMulNBits <name>_Q4/_Q8
            names.add(node.name.removesuffix("_quant").removesuffix("_Q4").removesuffix("_Q8"))
        elif node.op_type in _WEIGHTED and len(node.input) > 1:
            source = producers.get(node.input[1])
            if source is not None and source.op_type == "DequantizeLinear":
                names.add(node.name)
    return names


def _initializer_bytes(model) -> int:
    return sum(initializers.nbytes(t) for t in model.graph.initializer)

