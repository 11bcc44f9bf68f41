"""``exporter report A.artifact B.artifact ... --html FILE``: artifacts of one model side by
side (targets, dtypes, quantization recipes): size, where the ops run, validation error,
latency, with the best of each column marked, as AI Hub's and Olive's comparisons do."""

from __future__ import annotations

from html import escape
from pathlib import Path

from exporter.errors import UserInputError
from exporter.report import charts
from exporter.report.page import ms, prose, render_page, table
from exporter.report.perf import conditions
from exporter.report.speed import phrase
from exporter.report.validation import judged, number
from exporter.validation.gates import ERROR_BINS
from runtime.format.manifest import Manifest


def render_comparison(paths: list[Path], manifests: list[Manifest], sizes: list[int],
                      benches: list[dict | None]) -> str:
    _check_one_model(paths, manifests)
    rows = [summary(path, manifest, size, bench)
            for path, manifest, size, bench in zip(paths, manifests, sizes, benches)]
    best = _best(rows)
    cells = [[_cell(row, key, best) for key, _ in COLUMNS] for row in rows]
    spec = manifests[0].source.get("spec")
    body = (f"<header><h1>{len(rows)} builds of <code>{escape(str(spec))}</code></h1>"
            "<p>side by side; <span class=\"best key\">green</span>: the best of its column "
            "(smallest file, smallest error, lowest median latency)</p></header>"
            '<section id="comparison"><h2>Builds</h2>'
            + table([title for _, title in COLUMNS], cells, cls="compare", raw=True)
            + "</section>" + _latency(rows, benches) + _placement(paths, manifests))
    return render_page(f"comparison: {spec}", body, {"artifacts": rows})


# (key in a summary row, column title)
COLUMNS = [("artifact", "artifact"), ("target", "target"), ("kind", "dtype, recipe"),
           ("runs_on", "ops run on"), ("size_bytes", "size"), ("validation", "validation"),
           ("error_decade", "largest |error| vs eager"), ("median_ms", "latency median"),
           ("vs_eager", "against eager")]
# columns with a best value: key -> the better is the smaller (all of them are)
_RANKED = ("size_bytes", "error_rank", "median_ms")


def summary(path: Path, manifest: Manifest, size: int, bench: dict | None) -> dict:
    """One build's figures (the page's table row and its JSON)."""
    settings = manifest.build.get("settings", {})
    validation = manifest.validation or {}
    rank = _error_rank(validation)
    timing, vs_eager = _timing(bench or {})
    by_backend = manifest.placement.get("by_backend") or {}
    return {"artifact": path.name, "target": manifest.target,
            "kind": f"{settings.get('dtype', 'fp32')}, {settings.get('quantize') or 'float'}",
            "runs_on": ", ".join(f"{where} {count}" for where, count in by_backend.items()),
            "size_bytes": size, "validation": _gate_figures(validation),
            "error_rank": rank, "error_decade": _decade(rank),
            "median_ms": timing["median_ms"] if timing else None,
            "p10_ms": timing.get("p10_ms") if timing else None,
            "p90_ms": timing.get("p90_ms") if timing else None,
            "vs_eager": vs_eager}


def _timing(bench: dict) -> tuple[dict | None, float | None]:
    """The artifact's median (ms) and its ratio to eager: per call, or for a generating
    artifact's bench per decoded token (against transformers' eager generate)."""
    if "engines" not in bench:
        return bench.get("timings", {}).get("artifact"), bench.get("ratios", {}).get(
            "artifact/eager")
    rate = bench["engines"]["artifact"]["decode_tokens_per_s"]
    faster = bench.get("ratios", {}).get("artifact/hf-eager")  # tokens/s over eager's
    return ({"median_ms": 1e3 / rate} if rate else None), (1 / faster if faster else None)


def _check_one_model(paths: list[Path], manifests: list[Manifest]) -> None:
    specs = {str(m.source.get("spec")) for m in manifests}
    if len(specs) > 1:
        raise UserInputError(
            "the artifacts come from different models; a comparison is of one model's builds",
            details=[f"{path.name}: {m.source.get('spec')}" for path, m in zip(paths, manifests)],
            hint="compare builds of one spec (targets, dtypes, recipes), or report each alone")


def _error_rank(validation: dict) -> int | None:
    """The index in ERROR_BINS of the largest |error| any validated element had: one
    scale for float and quantized builds alike (both record the histogram)."""
    found = [ERROR_BINS.index(name) for row in validation.get("outputs", [])
             for compared in judged(row)
             for name, count in (compared.get("abs_err_histogram") or {}).items()
             if count and name in ERROR_BINS]
    return max(found) if found else None


def _decade(rank: int | None) -> str:
    """The bin as words: "0 (exact)", "below 1e-12", "1e-07 to 1e-06", "1 or more"."""
    if rank is None:
        return "?"
    name = ERROR_BINS[rank]
    if rank == 0:
        return "0 (exact)"
    if name.startswith("<"):
        return f"below {name[1:]}"
    if name.startswith(">="):
        return f"{name[2:]} or more"
    return f"{name} to {ERROR_BINS[rank + 1].removeprefix('>=')}"


def _gate_figures(validation: dict) -> str:
    if not validation or validation.get("skipped"):
        return "skipped"
    rows = validation.get("outputs", [])
    verdict = "passed" if validation.get("passed") else "FAILED"
    if validation.get("kind") == "generation":
        if validation.get("tokens_identical"):
            return f"{verdict}: greedy tokens identical to generate's"
        return (f"{verdict}: top-1 {number(validation.get('top1_agreement'), '.1%')}, "
                f"KL {number(validation.get('mean_kl'), '.2g')}")
    quantized = [r for r in rows if r.get("criterion") == "quantized"]
    if quantized:
        return (f"{verdict}: worst SQNR {min(r['sqnr_db'] for r in quantized):.1f} dB, "
                f"cosine {min(r['cosine'] for r in quantized):.5f}")
    used = max((r.get("ratio_to_allowed", 0.0) for r in rows), default=0.0)
    return f"{verdict}: worst float error {used:.1%} of its allowance"


def _best(rows: list[dict]) -> dict[str, float]:
    found = {}
    for key in _RANKED:
        values = [row[key] for row in rows if row[key] is not None]
        if len(values) > 1:
            found[key] = min(values)
    return found


def _cell(row: dict, key: str, best: dict) -> str:
    ranked = {"error_decade": "error_rank"}.get(key, key)
    value = row[key]
    text = ("-" if value is None else f"{value / 1e6:.3f} MB" if key == "size_bytes"
            else ms(value) + (f" ({row['p10_ms']:.3g} to {row['p90_ms']:.3g})"
                              if row.get("p90_ms") is not None else "")
            if key == "median_ms" else phrase(1 / value, "eager") if key == "vs_eager"
            else str(value))
    mark = ranked in best and row[ranked] is not None and row[ranked] == best[ranked]
    return f'<span class="best">{escape(text)}</span>' if mark else escape(text)


def _latency(rows: list[dict], benches: list[dict | None]) -> str:
    # a generating artifact's bench gives medians only: no whisker
    timed = {row["artifact"]: {"median_ms": row["median_ms"],
                               "p10_ms": row["p10_ms"] or row["median_ms"],
                               "p90_ms": row["p90_ms"] or row["median_ms"]}
             for row in rows if row["median_ms"]}
    if not timed:
        return ('<section id="latency"><h2>Latency</h2><p class="hint">not measured: pass '
                "<code>--bench FILE</code> once per artifact (<code>exporter bench ARTIFACT "
                "--json</code>)</p></section>")
    measured = [b for b in benches if b]
    machines = {(str((b.get("machine") or {}).get("cpu")), str((b.get("machine") or {})
                 .get("gpu"))) for b in measured}
    warn = ("<p class=\"warn\">measured on different machines: the latencies do not compare"
            "</p>" if len(machines) > 1 else "")
    best = min(timed, key=lambda name: timed[name]["median_ms"])
    return ('<section id="latency"><h2>Latency</h2><p>bar: median, whisker: p10 to p90; each '
            "artifact as its own <code>exporter bench</code> timed it (compare medians taken "
            f"on one machine)</p>{warn}<div class=\"side\">"
            + charts.latency_chart(timed, "time per decoded token in ms" if any(
                "engines" in b for b in measured) else "latency per call in ms", highlight=best)
            + conditions(measured[0]) + "</div></section>")


def _placement(paths: list[Path], manifests: list[Manifest]) -> str:
    strips = "".join(f"<h3>{escape(path.name)}</h3><p>{prose(_totals(m))}</p>"
                     + charts.op_strip(m.coverage) for path, m in zip(paths, manifests))
    return ('<section id="placement"><h2>Where each op runs</h2><p class="hint">one square '
            "per op in run order, coloured by where it runs (hover: op, reason)</p>"
            + strips + "</section>")


def _totals(manifest: Manifest) -> str:
    summary = manifest.placement or {}
    return (f"{summary.get('ops')} ops in {summary.get('partitions')} partition(s), "
            f"{summary.get('fallback_partitions')} on the CPU fallback")
