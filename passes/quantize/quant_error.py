"""How far a quantized model's values are from the float model's: SQNR and cosine, for
whole outputs (the validation gate, exporter/validation/gates.py) and per layer (each
quantized layer's output in the quantized model against the same layer's in the float
model, both run on the same inputs: the error a layer has accumulated by then, as
ExecuTorch's Inspector and AI Hub's per-layer comparisons show it).

Kept here, below the exporter and the targets, so that the PT2E pass and ONNX Runtime's
quantization (targets/onnx/quantize.py) compute it the one way the gate does.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Iterable

import torch

from passes.quantize.quant_graph import layer_name, weighted_op

log = logging.getLogger(__name__)


def sqnr_cosine(got: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """(SQNR in dB, cosine similarity) of ``got`` against ``reference``, in float64."""
    sums = ErrorSums()
    sums.add(got, reference)
    return sums.sqnr_db, sums.cosine


@dataclass
class ErrorSums:
    """Running sums over several input sets, so one layer gets one SQNR and cosine."""

    noise: float = 0.0  # sum (got - ref)^2
    signal: float = 0.0  # sum ref^2
    got_sq: float = 0.0  # sum got^2
    dot: float = 0.0  # sum got * ref
    identical: bool = True

    def add(self, got: torch.Tensor, reference: torch.Tensor) -> None:
        g, r = got.double().flatten(), reference.double().flatten()
        self.noise += float((g - r).pow(2).sum())
        self.signal += float(r.pow(2).sum())
        self.got_sq += float(g.pow(2).sum())
        self.dot += float(g @ r)
        self.identical &= bool(torch.equal(g, r))

    @property
    def sqnr_db(self) -> float:
        if self.noise == 0:
            return math.inf
        return 10 * math.log10(self.signal / self.noise) if self.signal else -math.inf

    @property
    def cosine(self) -> float:
        norms = math.sqrt(self.got_sq * self.signal)
        return self.dot / norms if norms else float(self.identical)


def layer_rows(sums: dict[str, ErrorSums], labels: dict[str, tuple[str, str]]) -> list[dict]:
    """Manifest rows ``{layer, op, sqnr_db, cosine}`` (``labels``: key -> (layer, op)).
    Rounded (0.01 dB, 1e-6) so that a rebuild's last-bit noise does not change the
    artifact's bytes; an exact layer's infinite SQNR is written as null (JSON has none)."""
    rows = []
    for key, total in sums.items():
        sqnr = total.sqnr_db
        layer, op = labels[key]
        rows.append({"layer": layer, "op": op,
                     "sqnr_db": round(sqnr, 2) if math.isfinite(sqnr) else None,
                     "cosine": round(total.cosine, 6)})
    return rows


def capture_values(module: torch.fx.GraphModule, wanted: Iterable[str],
                   flat_inputs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors the nodes named ``wanted`` compute when ``module`` runs on
    ``flat_inputs`` (its placeholders, in order)."""
    wanted = set(wanted)
    found: dict[str, torch.Tensor] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node):
            value = super().run_node(node)
            if node.name in wanted and isinstance(value, torch.Tensor):
                found[node.name] = value.detach()
            return value

    with torch.no_grad():
        Recorder(module).run(*flat_inputs)
    return found


def layer_errors(reference: torch.fx.GraphModule, quantized: torch.fx.GraphModule,
                 quantized_layers: list[str], input_sets: list[list[torch.Tensor]]
                 ) -> list[dict]:
    """Per quantized layer (by its ``layer_name``), its output in ``quantized`` against
    the same node's in the float ``reference`` over ``input_sets``, in graph order. A node
    a rewrite replaced (``products_as_linear``) is matched by the name it replaced
    (``meta["replaced"]``); layers missing from the reference are left out."""
    wanted = set(quantized_layers)
    layers = {}  # node in quantized -> (node in reference, (layer, op))
    for node in quantized.graph.nodes:
        op, _ = weighted_op(node)
        if op and layer_name(node) in wanted:
            layers[node.name] = (node.meta.get("replaced", node.name), (layer_name(node), op))
    sums: dict[str, ErrorSums] = {}
    for flat in input_sets:
        want = capture_values(reference, {ref for ref, _ in layers.values()}, flat)
        got = capture_values(quantized, layers, flat)
        for name, (ref, _) in layers.items():
            if name in got and ref in want and got[name].shape == want[ref].shape \
                    and want[ref].is_floating_point():
                sums.setdefault(name, ErrorSums()).add(got[name], want[ref])
    return layer_rows(sums, {name: label for name, (_, label) in layers.items()})


def layer_error_record(reference: torch.fx.GraphModule, quantized: torch.fx.GraphModule,
                       quantized_layers: list[str], input_sets: list[list[torch.Tensor]],
                       on: str) -> dict:
    """The quantize record's ``layer_errors`` and ``layer_errors_on`` (what inputs). A
    diagnostic: if it cannot be computed, the build goes on and the record says why."""
    try:
        return {"layer_errors": layer_errors(reference, quantized, quantized_layers,
                                             input_sets), "layer_errors_on": on}
    except Exception as exc:  # noqa: BLE001 - any op may fail under the interpreter
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        log.warning("per-layer quantization error not computed (%s: %s)",
                    type(exc).__name__, first)
        return {"layer_errors": [],
                "layer_errors_on": f"not computed ({type(exc).__name__}: {first})"}
