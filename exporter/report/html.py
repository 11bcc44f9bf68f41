"""``exporter report ARTIFACT --html FILE``: one self-contained page about an artifact.

Everything comes from the verified manifest (plus an ``exporter bench --json`` result
when given): the signature, where each op runs (partition graph and per-op strip), the
validation errors as histograms, latency bars, the memory timeline, the passes. No
external resource: the page's Content-Security-Policy forbids any, so a page that would
need the network shows that as a violation in the browser test rather than silently.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from html import escape
from pathlib import Path

from exporter.report import charts
from exporter.errors import UserInputError
from runtime.outfiles import checked_output, written_whole
from exporter.report.memory_plot import live_bytes_per_step
from exporter.report.console import memory_lines, quantization_lines, validation_lines
from exporter.validation.gates import ERROR_BINS, error_bin
from runtime.manifest import Manifest
from runtime.signing import describe_signature, signature_status

CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
       "img-src data:")
# Past these, the op table and the partition graph start folded (one click opens them):
# the page should open on the summary, not on a screen-high list.
FOLD_OPS, FOLD_PARTITIONS = 30, 12


def write_report(artifact: Path, out: Path, bench_file: Path | None = None) -> None:
    """Read and verify the artifact, render the page, write it whole or not at all."""
    from runtime.archive import ArtifactReader

    checked_output(out, flag="--html")  # before any work
    bench = _read_bench(bench_file) if bench_file else None
    with ArtifactReader.open(artifact) as reader:
        manifest = Manifest.from_dict(reader.manifest, where=str(artifact))
        signature = signature_status(reader)  # no key here: never claims "verified"
    page = render(manifest, artifact_name=artifact.name, size=artifact.stat().st_size,
                  signature=signature, bench=bench)
    with written_whole(out, flag="--html") as partial:
        partial.write_text(page, encoding="utf-8")


def _read_bench(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        timings = data["timings"]
        if not all(isinstance(t["median_ms"], (int, float)) for t in timings.values()):
            raise TypeError("median_ms is not a number")
        return data
    except OSError as exc:
        raise UserInputError(f"cannot read the bench result ({exc.strerror})",
                             where=str(path)) from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserInputError(f"not an `exporter bench --json` result ({exc})", where=str(path),
                             hint="write one with: exporter bench ARTIFACT --json > bench.json"
                             ) from None


def render(manifest: Manifest, *, artifact_name: str, size: int, signature: dict | None,
           bench: dict | None) -> str:
    sections = [_header(manifest, artifact_name, size, signature), _signature(manifest),
                _placement(manifest), _validation(manifest), _latency(bench),
                _memory(manifest), _passes(manifest)]
    rows = [{**row, "colour": charts.placement_colour(row["backend"], row["device"])}
            for row in manifest.coverage]
    data = json.dumps({"coverage": rows}, sort_keys=True).replace("<", "\\u003c")
    return _PAGE.format(title=escape(f"{artifact_name}: {manifest.target}"), csp=CSP, css=_CSS,
                        body="\n".join(sections), data=data, script=_SCRIPT)


def _header(manifest: Manifest, name: str, size: int, signature: dict | None) -> str:
    made = manifest.created_by
    signed = (f'<span class="warn">{escape(describe_signature(signature))}</span>'
              if signature else '<span class="warn">not signed</span> (exporter sign)')
    needs = ", ".join(manifest.requirements.describe())
    return (f"<header><h1>{escape(name)}</h1><p>target <b>{escape(manifest.target)}</b> · "
            f"from <code>{escape(str(manifest.source.get('spec')))}</code> · "
            f"{size / 1e6:.2f} MB · {signed}</p><p>built by "
            f"{escape(str(made.get('toolchain')))} with torch {escape(str(made.get('torch')))}"
            f" · requires {escape(needs)}</p></header>")


def _table(headers: list[str], rows: list[list], cls: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _signature(manifest: Manifest) -> str:
    rows = [[kind, spec.name, spec.dtype, "[" + ", ".join(d.describe() for d in spec.shape) + "]"]
            for kind, specs in (("input", manifest.signature.inputs),
                                ("output", manifest.signature.outputs)) for spec in specs]
    return ('<section id="signature"><h2>Signature</h2>'
            + _table(["kind", "name", "dtype", "shape"], rows) + "</section>")


def _placement(manifest: Manifest) -> str:
    kinds: dict[str, Counter] = {}  # partition -> op kinds, e.g. "linear", "getitem"
    for row in manifest.coverage:
        kinds.setdefault(row.get("partition"), Counter())[_op_kind(row["op"])] += 1
    partitions = [{**p.to_json(), "ops": sum(kinds.get(p.name, Counter()).values()),
                   "op_kinds": [k for k, _ in kinds.get(p.name, Counter()).most_common()]}
                  for p in manifest.partitions]
    used = sorted({(p.backend, p.device) for p in manifest.partitions})
    legend = "".join(f'<span class="chip" style="background:'
                     f'{charts.placement_colour(b, d)}">{escape(b)} @ {escape(d)}</span>'
                     for b, d in used)
    summary = manifest.placement
    totals = (f"{summary.get('ops')} ops in {summary.get('partitions')} partition(s): "
              f"{summary.get('delegated_partitions')} delegated, "
              f"{summary.get('fallback_partitions')} on the CPU fallback; "
              f"{summary.get('device_transfers')} device transfer(s)") if summary else ""
    graph = charts.partition_graph(partitions, [s.name for s in manifest.signature.inputs],
                                   [s.name for s in manifest.signature.outputs])
    if len(partitions) > FOLD_PARTITIONS:  # a long graph starts folded, like the op table
        graph = (f'<details id="graph-details"><summary>the partition graph '
                 f"({len(partitions)} partitions)</summary>{graph}</details>")
    return ('<section id="placement"><h2>Where each op runs</h2>'
            f"<p>{legend}</p><p>{escape(totals)}</p>{graph}"
            "<h3>Ops in run order</h3><p class=\"hint\">hover a square: op, reason, source</p>"
            + charts.op_strip(manifest.coverage)
            + '<h3>Every op</h3><input id="op-filter" placeholder="filter: op, partition, '
              'reason…" size="40"> <span id="op-count"></span>'
            # a long table starts folded (typing in the filter unfolds it)
            + f'<details id="op-details"{" open" if len(manifest.coverage) <= FOLD_OPS else ""}>'
              "<summary>the table</summary>"
              '<table id="ops"><thead><tr><th>node</th><th>op</th><th>runs on</th>'
              "<th>partition</th><th>why</th><th>source</th></tr></thead><tbody></tbody>"
              "</table></details></section>")


def _op_kind(op: str) -> str:
    """aten.linear.default -> linear; <built-in function getitem> -> getitem."""
    builtin = re.fullmatch(r"<built-in function (\w+)>", op)
    if builtin:
        return builtin.group(1)
    parts = op.split(".")
    return parts[1] if len(parts) > 1 else op


def _validation(manifest: Manifest) -> str:
    record = manifest.validation
    lines = "".join(f"<p>{escape(line)}</p>" for line in validation_lines(record))
    if not record or record.get("skipped"):
        return f'<section id="validation"><h2>Validation</h2>{lines}</section>'
    per_output: dict[str, Counter] = {}
    allowed: dict[str, float] = {}
    for row in record.get("outputs", []):
        per_output.setdefault(row["output"], Counter()).update(row.get("abs_err_histogram", {}))
        if "allowed" in row:
            allowed[row["output"]] = max(allowed.get(row["output"], 0.0), row["allowed"])
    charts_html = "".join(
        charts.histogram(counts, ERROR_BINS,
                         error_bin(allowed[name]) if name in allowed else None,
                         f"{name}: |artifact − reference| per element, all cases")
        for name, counts in per_output.items() if counts)
    if not charts_html:
        charts_html = "<p>(this artifact's validation predates error histograms)</p>"
    rows = [[r["case"], r["output"], "passed" if r["passed"] else "FAILED",
             r.get("criterion", ""), _figure(r)] for r in record.get("outputs", [])]
    return ('<section id="validation"><h2>Validation against eager</h2>' + lines + charts_html
            + _table(["case", "output", "verdict", "criterion", "figures"], rows) + "</section>")


def _figure(row: dict) -> str:
    if row.get("criterion") == "relative-to-eager":
        return (f"max |err| {row['max_abs_err']:.3g} (allowed {row['allowed']:.3g}, eager's own "
                f"{row['eager_max_abs_err']:.3g})")
    if row.get("criterion") == "quantized":
        return f"SQNR {row['sqnr_db']:.1f} dB, cosine {row['cosine']:.5f}"
    return row.get("problem") or f"{row.get('mismatches', 0)} mismatches"


def _latency(bench: dict | None) -> str:
    if bench is None:
        return ('<section id="latency"><h2>Latency</h2><p class="hint">not measured: pass '
                "<code>--bench FILE</code> from <code>exporter bench ARTIFACT --json</code>"
                "</p></section>")
    ratios = ", ".join(f"{name} {value:.2f}x" for name, value in bench.get("ratios", {}).items())
    return ('<section id="latency"><h2>Latency</h2>'
            f"<p>{escape(str(bench.get('device')))} {escape(str(bench.get('dtype')))}, "
            f"{escape(str(bench.get('runs')))} runs side by side, timer "
            f"{escape(str(bench.get('timer')))}; {escape(ratios)}</p>"
            + charts.bars(bench["timings"]) + "</section>")


def _memory(manifest: Manifest) -> str:
    plan = manifest.memory_plan
    lines = "".join(f"<p>{escape(line)}</p>" for line in
                    [*memory_lines(manifest), *quantization_lines(manifest)])
    if not plan or not plan.get("offsets"):
        return f'<section id="memory"><h2>Memory</h2>{lines or "<p>no plan</p>"}</section>'
    chart = charts.timeline(live_bytes_per_step(plan), plan["arena_bytes"],
                            plan["lower_bound_bytes"])
    return f'<section id="memory"><h2>Memory plan</h2>{lines}{chart}</section>'


def _passes(manifest: Manifest) -> str:
    rows = [[r["name"], "yes" if r.get("modified") else "no",
             ", ".join(f"{k} {v}" for k, v in sorted((r.get("info") or {}).items())
                       if not isinstance(v, (list, dict)))] for r in manifest.passes]
    notes = "".join(f"<li>{escape(n)}</li>" for n in [*manifest.build.get("notes", []),
                                                     *manifest.build.get("nondeterminism", [])])
    return ('<section id="passes"><h2>Passes</h2>'
            + _table(["pass", "changed the graph", "figures"], rows)
            + (f"<h3>Build notes</h3><ul>{notes}</ul>" if notes else "") + "</section>")


_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#212529}
h1{font-size:22px;margin:0 0 4px}h2{border-bottom:1px solid #dee2e6;padding-bottom:4px}
section{margin:28px 0}table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #dee2e6;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f1f3f5}code{background:#f1f3f5;padding:0 3px}.hint{color:#868e96}
.chip{color:#fff;border-radius:4px;padding:2px 8px;margin-right:6px}
.ok{color:#2f9e44;font-weight:600}.warn{color:#e8590c;font-weight:600}
#ops td:first-child{border-left-width:6px}svg{display:block;margin:8px 0;overflow:visible}
"""

# Errors and CSP violations are counted on <html data-errors>; the last script sets
# data-rendered, so a test (or a person) can tell a page that ran from one that broke.
_SCRIPT = """
(function () {
  const data = JSON.parse(document.getElementById('report-data').textContent);
  const body = document.querySelector('#ops tbody');
  const filter = document.getElementById('op-filter');
  const columns = ['node', 'op', 'where', 'partition', 'reason', 'source'];
  function row(op) {
    const tr = document.createElement('tr');
    for (const key of columns) {
      const td = document.createElement('td');
      td.textContent = key === 'where' ? op.backend + ' @ ' + op.device : (op[key] || '');
      tr.append(td);
    }
    tr.firstChild.style.borderLeftColor = op.colour;
    return tr;
  }
  function render() {
    const query = filter.value.toLowerCase();
    const shown = data.coverage.filter(
      (op) => !query || JSON.stringify(op).toLowerCase().includes(query));
    body.replaceChildren(...shown.map(row));
    document.getElementById('op-count').textContent =
      shown.length + ' of ' + data.coverage.length + ' ops';
  }
  filter.addEventListener('input', () => {
    document.getElementById('op-details').open = true;
    render();
  });
  render();
  document.documentElement.dataset.rendered = 'yes';
})();
"""

_PAGE = """<!DOCTYPE html>
<html lang="en" data-errors="0"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<title>{title}</title><style>{css}</style>
<script>
(function () {{
  function count(message) {{
    const html = document.documentElement;
    html.dataset.errors = String(Number(html.dataset.errors) + 1);
    html.dataset.lastError = message;
  }}
  window.addEventListener('error', (e) => count(String(e.message)));
  document.addEventListener('securitypolicyviolation', (e) => count('CSP: ' + e.blockedURI));
}})();
</script></head>
<body>
{body}
<script id="report-data" type="application/json">{data}</script>
<script>{script}</script>
</body></html>
"""
