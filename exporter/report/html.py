"""``exporter report ARTIFACT --html FILE``: one self-contained page about an artifact;
``exporter report A B ... --html FILE``: one page comparing artifacts of one model
(exporter/report/compare.py).

Everything comes from the verified manifest and the artifact's own files (plus an
``exporter bench --json`` result when given): the signature, where each op runs
(partition graph and per-op strip), the validation errors as histograms, the latency
chart with the machine it was measured on and the time per partition and per node,
FLOPs and weight bytes per layer, the per-layer quantization error, each partition's
own graph, the memory timeline, the passes.
"""

from __future__ import annotations

import re
from collections import Counter
from html import escape
from pathlib import Path

from exporter.errors import UserInputError
from exporter.report import charts
from exporter.report.compare import render_comparison
from exporter.report.console import inside_lines, memory_lines, quantization_lines
from exporter.report.graphs import graphs_section, read_graphs
from exporter.report.layers import layers_section, quantization_section
from exporter.report.memory_plot import live_bytes_per_step
from exporter.report.page import program_blocks, prose, render_page, table
from exporter.report.perf import latency_section, read_bench
from exporter.report.validation import validation_section
from runtime.format.manifest import Manifest, reading_reports
from runtime.format.signing import describe_signature, signature_status
from runtime.host.outfiles import checked_output, written_whole

# Past these, the op table and the partition graph start folded (one click opens them):
# the page should open on the summary, not on a screen-high list.
FOLD_OPS, FOLD_PARTITIONS = 30, 12


def write_report(artifacts: list[Path], out: Path, bench_files: list[Path] = ()) -> None:
    """Read and verify the artifacts, render the page (one artifact: its report; several:
    their comparison), write it whole or not at all."""
    checked_output(out, flag="--html", reads=[*artifacts, *bench_files])  # before any work
    if not artifacts:
        raise UserInputError("no artifact to report on", hint="exporter report A.artifact "
                                                              "--html report.html")
    benches = [read_bench(path) for path in bench_files]
    loaded = [load(path) for path in artifacts]
    matched = match_benches(artifacts, benches, bench_files)
    with reading_reports(", ".join(map(str, artifacts))):
        if len(loaded) == 1:
            manifest, size, signature, graphs = loaded[0]
            page = render(manifest, artifact_name=artifacts[0].name, size=size,
                          signature=signature, bench=matched[0], graphs=graphs)
        else:
            page = render_comparison(artifacts, [m for m, *_ in loaded],
                                     [s for _, s, *_ in loaded], matched)
    with written_whole(out, flag="--html") as partial:
        partial.write_text(page, encoding="utf-8")


def load(path: Path) -> tuple[Manifest, int, dict | None, dict]:
    """The verified manifest, file size, signature status and partition graphs."""
    from runtime.format.archive import ArtifactReader

    with ArtifactReader.open(path) as reader:
        manifest = Manifest.from_dict(reader.manifest, where=str(path))
        signature = signature_status(reader)  # no key here: never claims "verified"
        graphs = read_graphs(manifest, reader)
    return manifest, path.stat().st_size, signature, graphs


def match_benches(artifacts: list[Path], benches: list[dict], files: list[Path]
                  ) -> list[dict | None]:
    """Each artifact's bench result: the one whose ``artifact`` names it (one artifact
    and one result: that result). A result that names none of them is an error."""
    if len(artifacts) == 1 and len(benches) == 1:
        return [benches[0]]
    found: list[dict | None] = [None] * len(artifacts)
    for bench, file in zip(benches, files):
        named = Path(str(bench.get("artifact", "")))
        index = next((i for i, path in enumerate(artifacts)
                      if named.resolve() == path.resolve()), None)
        if index is None:
            index = next((i for i, path in enumerate(artifacts) if named.name == path.name),
                         None)
        if index is None:
            raise UserInputError(f"the bench result is of {named}, which is not among the "
                                 "artifacts given", where=str(file),
                                 hint="give one `exporter bench ARTIFACT --json` result per "
                                      "artifact, of those artifacts")
        found[index] = bench
    return found


def render(manifest: Manifest, *, artifact_name: str, size: int, signature: dict | None,
           bench: dict | None, graphs: dict | None = None) -> str:
    runs = programs(manifest)
    sections = [_header(manifest, artifact_name, size, signature), _signature(runs),
                _placement(manifest, runs), validation_section(manifest.validation),
                latency_section(bench, manifest), layers_section(runs),
                quantization_section(runs),
                graphs_section(runs, graphs) if graphs is not None else "",
                _memory(manifest, runs), _passes(manifest, runs)]
    rows = [{**row, "colour": charts.placement_colour(row["backend"], row["device"])}
            for _, program in runs for row in program.coverage]
    return render_page(f"{artifact_name}: {manifest.target}", "\n".join(sections),
                       {"coverage": rows}, _SCRIPT)


def programs(manifest: Manifest) -> list[tuple[str | None, Manifest]]:
    """The artifact's programs, each seen as a manifest of its own: the one program of a
    plain artifact (unlabelled); a generating artifact's prefill and each entry point
    (decode, encode), with their own signature, partitions, ops, memory plan and passes."""
    if manifest.generation is None:
        return [(None, manifest)]
    main = "prefill" if "decode" in manifest.entry_points else "prefill (also decodes)"
    return [(main, manifest), *((name, manifest.entry_point(name))
                                for name in manifest.entry_points)]


def _header(manifest: Manifest, name: str, size: int, signature: dict | None) -> str:
    made = manifest.created_by
    signed = (f'<span class="warn">{prose(describe_signature(signature))}</span>'
              if signature else '<span class="warn">not signed</span> (<code>exporter sign'
                                '</code>)')
    needs = ", ".join(manifest.requirements.describe())
    return (f"<header><h1>{escape(name)}</h1><p>target <b>{escape(manifest.target)}</b> · "
            f"{escape(build_kind(manifest))} · from "
            f"<code>{escape(str(manifest.source.get('spec')))}</code> · {size / 1e6:.2f} MB · "
            f"{signed}</p><p>built by {escape(str(made.get('toolchain')))} with torch "
            f"{escape(str(made.get('torch')))} · requires {escape(needs)}</p></header>")


def build_kind(manifest: Manifest) -> str:
    """'fp16', 'fp32, int8-dynamic': the dtype and quantization recipe of the build."""
    settings = manifest.build.get("settings", {})
    recipe = settings.get("quantize")
    return str(settings.get("dtype", "fp32")) + (f", {recipe}" if recipe else "")


def _signature(runs: list[tuple[str | None, Manifest]]) -> str:
    def one(manifest: Manifest) -> str:
        rows = [[kind, spec.name, spec.dtype,
                 "[" + ", ".join(d.describe() for d in spec.shape) + "]"]
                for kind, specs in (("input", manifest.signature.inputs),
                                    ("output", manifest.signature.outputs)) for spec in specs]
        return table(["kind", "name", "dtype", "shape"], rows)
    return '<section id="signature"><h2>Signature</h2>' + program_blocks(runs, one) + "</section>"


def _placement(manifest: Manifest, runs: list[tuple[str | None, Manifest]]) -> str:
    partitions = manifest.all_partitions()
    used = sorted({(p.backend, p.device) for p in partitions})
    legend = "".join(f'<span class="chip" style="background:'
                     f'{charts.placement_colour(b, d)}">{escape(b)} @ {escape(d)}</span>'
                     for b, d in used)
    ops = sum(len(program.coverage) for _, program in runs)
    return ('<section id="placement"><h2>Where each op runs</h2>'
            f"<p>{legend}</p>{program_blocks(runs, _program_placement)}"
            '<h3>Every op</h3><input id="op-filter" placeholder="filter: op, partition, '
            'reason…" size="40"> <span id="op-count"></span>'
            # a long table starts folded (typing in the filter unfolds it)
            + f'<details id="op-details"{" open" if ops <= FOLD_OPS else ""}>'
              "<summary>the table</summary>"
              '<table id="ops"><thead><tr><th>node</th><th>op</th><th>runs on</th>'
              "<th>partition</th><th>why</th><th>source</th></tr></thead><tbody></tbody>"
              "</table></details></section>")


def _program_placement(manifest: Manifest) -> str:
    """One program's totals, partition graph and ops in run order."""
    kinds: dict[str, Counter] = {}  # partition -> op kinds, e.g. "linear", "getitem"
    for row in manifest.coverage:
        kinds.setdefault(row.get("partition"), Counter())[_op_kind(row["op"])] += 1
    partitions = [{**p.to_json(), "ops": sum(kinds.get(p.name, Counter()).values()),
                   "op_kinds": [k for k, _ in kinds.get(p.name, Counter()).most_common()]}
                  for p in manifest.partitions]
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
    inside = "".join(f"<p>{prose(line)}</p>" for line in inside_lines(manifest))
    return (f"<p>{prose(totals)}</p>{inside}{graph}<h4>Ops in run order</h4>"
            '<p class="hint">hover a square: op, reason, source</p>'
            + charts.op_strip(manifest.coverage))


def _op_kind(op: str) -> str:
    """aten.linear.default -> linear; operator.getitem (or, in older artifacts,
    <built-in function getitem>) -> getitem."""
    builtin = re.fullmatch(r"<built-in function (\w+)>", op)
    if builtin:
        return builtin.group(1)
    parts = op.split(".")
    return parts[1] if len(parts) > 1 else op


def _memory(manifest: Manifest, runs: list[tuple[str | None, Manifest]]) -> str:
    quantized = "".join(f"<p>{prose(line)}</p>" for line in quantization_lines(manifest))
    planned = any(program.memory_plan for _, program in runs)
    return (f'<section id="memory"><h2>Memory{" plan" if planned else ""}</h2>{quantized}'
            + program_blocks(runs, _program_memory) + "</section>")


def _program_memory(manifest: Manifest) -> str:
    plan = manifest.memory_plan
    lines = "".join(f"<p>{prose(line)}</p>" for line in memory_lines(manifest))
    if not plan or not plan.get("offsets"):
        return lines or "<p>no plan</p>"
    return lines + charts.timeline(live_bytes_per_step(plan), plan["arena_bytes"],
                                   plan["lower_bound_bytes"])


def _passes(manifest: Manifest, runs: list[tuple[str | None, Manifest]]) -> str:
    def one(program: Manifest) -> str:
        rows = [[r.get("name"), "yes" if r.get("modified") else "no",
                 ", ".join(f"{k} {v}" for k, v in sorted((r.get("info") or {}).items())
                           if not isinstance(v, (list, dict)))] for r in program.passes]
        return table(["pass", "changed the graph", "figures"], rows)
    notes = "".join(f"<li>{prose(n)}</li>" for n in [*manifest.build.get("notes", []),
                                                     *manifest.build.get("nondeterminism", [])])
    return ('<section id="passes"><h2>Passes</h2>' + program_blocks(runs, one)
            + (f"<h3>Build notes</h3><ul>{notes}</ul>" if notes else "") + "</section>")


# The op table's filter (the op rows come as JSON in #report-data).
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
})();
"""
