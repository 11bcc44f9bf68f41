"""Quantize a program with torchao's PT2E flow: prepare, calibrate, convert, re-capture.

The quantizer comes from the target (X86InductorQuantizer for ``cpu``), so each
target decides which recipe it can run; this pass only drives the flow and reports:
layers quantized, layers left in float (with why), weight bytes before and after.

    before: linear(x, w: f32)
    after:  linear(dq(q(x)), dq(w: int8 per channel))   -> Inductor fuses into an int8 GEMM
            embedding(ids, table: int8 per row)        -> only gathered rows dequantized

Run after dead-code cleanup: ``prepare_pt2e`` failed with a bare ``IndexError`` on an
unused pooler left behind by outputs the caller drops.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import drop_unused_weights, recapture
from passes.quantize.quant_error import layer_error_record
from passes.quantize.quant_graph import (copy_sharing_weights, label_linears, layer_name,
                                         products_as_linear, quiet_torchao,
                                         reads_only_weights, weight_bytes, weighted_op)
from passes.quantize.quantize_weight_only import quantize_weights
from runtime.program.flat_inputs import flatten_inputs

_DEQUANTIZE = ("dequantize_per_channel", "dequantize_per_tensor", "dequantize_affine")


class QuantizePT2E:
    name = "quantize"
    required = True  # the user asked for it: a failure fails the build

    def __init__(self, recipe: str, make_quantizer: Callable[[], object],
                 calibration: Sequence[Sequence[torch.Tensor]], how: str,
                 record: dict | None = None) -> None:
        self.recipe, self.make_quantizer, self.how = recipe, make_quantizer, how
        self.record = dict(record or {})  # the target's own facts for the report
        self.calibration = list(calibration)  # flat input sets; [] for dynamic recipes

    @quiet_torchao()
    def __call__(self, program: ExportedProgram) -> PassResult:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        inputs = flatten_inputs(*program.example_inputs)
        before = weight_bytes(program)
        # A copy: program.module() shares its parameters with the user's model, which
        # eager validation still needs in float32.
        module = copy_sharing_weights(program.module())
        rewritten = products_as_linear(module)
        label_linears(module)
        prepared = prepare_pt2e(module, self.make_quantizer())
        with torch.no_grad():
            for flat in self.calibration or [inputs.tensors]:
                args, kwargs = inputs.rebuild(list(flat))
                prepared(*args, **kwargs)
        converted = convert_pt2e(prepared)
        quantized, in_float = _layers(converted)
        # PT2E's X86 quantizer leaves embedding tables in float (a quarter of BERT-base's
        # weights); its EmbeddingQuantizer (uint8, float zero points) cost tiny GPT-2
        # 30 dB of SQNR here, torchao's symmetric int8 rows cost nothing measurable.
        tables, tables_float = quantize_weights(converted, "int8-weight", only={"embedding"})
        errors = layer_error_record(
            program.module(), converted, tables + quantized, self.calibration or [inputs.tensors],
            f"{len(self.calibration)} calibration set(s)" if self.calibration
            else "the example inputs")
        drop_unused_weights(converted)
        recaptured = recapture(converted, program).run_decompositions({})
        info = {"recipe": self.recipe, "how": self.how,
                "calibration_sets": len(self.calibration), "rewritten_as_linear": rewritten,
                "layers_quantized": tables + quantized, "layers_float": tables_float + in_float,
                "weight_bytes_before": before, "weight_bytes_after": weight_bytes(recaptured),
                **self.record, **errors}
        return PassResult(recaptured, modified=bool(quantized), info=info)


def _layers(module: torch.fx.GraphModule) -> tuple[list[str], list[dict]]:
    """Weighted ops by whether their weight now comes out of a dequantize node."""
    quantized, in_float = [], []
    for node in module.graph.nodes:
        op, weight = weighted_op(node)
        if not isinstance(weight, torch.fx.Node) or op == "embedding":
            continue  # embedding tables: quantize_weights, after
        where = layer_name(node)
        producer = getattr(weight.target, "__name__", "")
        if producer.startswith(_DEQUANTIZE):
            quantized.append(where)
        elif weight.op == "get_attr" or reads_only_weights(weight):
            in_float.append({"layer": where, "op": op,
                             "why": "the recipe's quantizer left it unannotated"})
        # an activation x activation product (attention scores) is not a weighted layer
    return quantized, in_float
