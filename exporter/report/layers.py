"""The report's per-layer sections, from the manifest: what each op costs (FLOPs and the
weight bytes it reads, recorded at build time by passes/graph/cost.py) and, for a quantized
build, each quantized layer's error against the float model."""

from __future__ import annotations

from html import escape

from exporter.report import charts
from exporter.report.console import quantization_records
from exporter.report.page import program_blocks, prose, share_bar, table
from runtime.format.manifest import Manifest

# Past this many layers the table starts folded: the page opens on the summary.
FOLD_LAYERS = 40


def layers_section(programs: list[tuple[str | None, Manifest]]) -> str:
    """Each program's layers (a generating artifact's prefill, decode, encode: FLOPs are
    per call of that program)."""
    return ('<section id="layers"><h2>Layers: FLOPs and weights</h2>'
            + program_blocks(programs, _layers) + "</section>")


def _layers(manifest: Manifest) -> str:
    rows = [r for r in manifest.coverage if "flops" in r]
    if not rows:
        return ('<p class="hint">this artifact predates per-op FLOPs and weight bytes: '
                "rebuild it to see them</p>")
    costly = [r for r in rows if (r.get("flops") or 0) or r.get("weight_bytes")]
    flops = sum(r.get("flops") or 0 for r in rows)
    weights = sum(r.get("weight_bytes") or 0 for r in rows)
    unknown = [r["node"] for r in rows if r.get("flops") is None]
    by_partition = {}
    for r in rows:
        by_partition[r.get("partition")] = by_partition.get(r.get("partition"), 0) + (
            r.get("flops") or 0)
    split = ", ".join(f"{name} {_flops(value)}" for name, value in by_partition.items())
    top_flops = max((r.get("flops") or 0 for r in costly), default=0)
    top_bytes = max((r.get("weight_bytes") or 0 for r in costly), default=0)
    cells = [[escape(r["node"]), escape(_kind(r["op"])), escape(r.get("module") or "(top)"),
              f'<span class="chip" style="background:'
              f'{charts.placement_colour(r["backend"], r["device"])}">'
              f'{escape(str(r.get("partition")))}</span>',
              share_bar(r.get("flops") or 0, top_flops, _flops(r.get("flops"))),
              share_bar(r.get("weight_bytes") or 0, top_bytes, _bytes(r.get("weight_bytes")))]
             for r in costly]
    folded = len(cells) > FOLD_LAYERS
    listing = table(["node", "op", "module", "partition", "FLOPs", "weight bytes"], cells,
                    cls="layers", raw=True)
    return (f"<p>{_flops(flops)} per call in total ({escape(split)}), weights read "
            f"{_bytes(weights)}. FLOPs: torch's formulas "
            "(<code>torch.utils.flop_counter.FlopCounterMode</code>, each op re-run on meta "
            "tensors of its example shapes, at the build's example inputs); matrix products, "
            "convolutions and attention only, elementwise ops count 0. Weight bytes: the "
            "stored parameters, buffers and constants an op reads (a shared weight counts "
            "in each reader); in ATen's graph, before a backend's own quantization.</p>"
            + (f'<p class="hint">no FLOP formula ran for: {escape(", ".join(unknown[:20]))}'
               "</p>" if unknown else "")
            + (f"<details><summary>{len(cells)} ops with FLOPs or weights</summary>{listing}"
               "</details>" if folded else listing))


def quantization_section(programs: list[tuple[str | None, Manifest]]) -> str:
    """What --quantize did to each program (each entry point quantizes its own graph)."""
    found = [(label, info) for label, manifest in programs
             for info in quantization_records(manifest)]
    head = '<section id="quantization"><h2>Quantization error per layer</h2>'
    if not found:
        return (head + "<p>not quantized: a float build (its error against eager is under "
                "Validation)</p></section>")
    blocks = []
    for label, info in found:
        rows = info.get("layer_errors")
        summary = ((f"[{label}] " if label else "")
                   + f"{info['recipe']} ({info['how']}): {len(info['layers_quantized'])} "
                   f"layer(s) quantized, {len(info['layers_float'])} left in float")
        if rows is None:
            blocks.append(f"<p>{prose(summary)}</p><p class=\"hint\">this artifact predates "
                          "per-layer errors: rebuild it to see them; the SQNR and cosine of "
                          "each output are under Validation</p>")
            continue
        blocks.append(f"<p>{prose(summary)}; measured on {prose(info.get('layer_errors_on'))}"
                      "</p>" + _error_table(rows))
    return (head + "<p>each quantized layer's output in the quantized model against the "
            "same layer's in the float model, both run on the same inputs: the error the "
            "model has accumulated by that layer. SQNR in dB (higher is closer; 20 dB is "
            "1% noise power), cosine similarity (1 is identical).</p>" + "".join(blocks)
            + "</section>")


def _error_table(rows: list[dict]) -> str:
    if not rows:
        return "<p class=\"hint\">no layer could be compared</p>"
    finite = [r["sqnr_db"] for r in rows if r.get("sqnr_db") is not None]
    worst = min(finite, default=None)
    largest = max(finite, default=1.0) or 1.0
    cells = []
    for r in rows:
        sqnr = r.get("sqnr_db")
        text = "exact" if sqnr is None else f"{sqnr:.2f} dB"
        mark = ' class="worst"' if sqnr is not None and sqnr == worst else ""
        cells.append([f"<span{mark}>{escape(r['layer'])}</span>", escape(r.get("op", "")),
                      share_bar(largest if sqnr is None else max(sqnr, 0.0), largest, text),
                      escape(f"{r.get('cosine', 0):.6f}")])
    note = f"worst: {worst:.2f} dB" if worst is not None else "every layer exact"
    return (f'<p class="hint">{escape(note)}</p>'
            + table(["layer", "op", "SQNR", "cosine"], cells, cls="quant-errors", raw=True))


def _kind(op: str) -> str:
    parts = op.split(".")
    return parts[1] if len(parts) > 2 else op


def _flops(value: int | None) -> str:
    if value is None:
        return "?"
    for unit, size in (("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value} FLOP"


def _bytes(value: int | None) -> str:
    if not value:
        return "0 B"
    for unit, size in (("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value} B"
