"""The matrix as a table: one row per model, one column per target recipe. ``cell_text``
says what a cell holds (pass/fail with stage and reason, build time, size, validation
error, ops on the CPU fallback, latency and its ratio to eager); ``html`` lays it out in
the report's style (exporter/report/html.py) and ``markdown`` for Markdown pages.
"""

from __future__ import annotations

from html import escape

from exporter.report.page import CSP
from exporter.report.speed import phrase
from exporter.report.page import CSS as REPORT_CSS  # one look for every page we write

_CSS = REPORT_CSS + """
td.ok{background:#ebfbee}td.fail{background:#fff5f5}td.not-run{background:#f8f9fa}
td .why{color:#c92a2a}td.cell{min-width:150px;font-size:13px}
"""


def cell_text(row: dict | None) -> tuple[str, list[str]]:
    """(verdict, detail lines) of one cell."""
    if row is None or row.get("status") == "not-run":
        return "not run", []
    if row["status"] not in ("ok", "unvalidated"):
        where = f" in {row['stage']}" if row.get("stage") else ""
        # the verdict already says the status: the line names the error's type, if any
        reason = ": ".join(filter(None, [row.get("error_type"), _first_line(row.get("error"))]))
        # the last line under the error (a validation process's own message, say)
        cause = _first_line((row.get("error_details") or [None])[-1])
        return f"{row['status']}{where}", list(filter(None, [reason, cause, _accuracy(row)]))
    lines = [" · ".join(filter(None, [
        f"{row['build_s']:.0f} s" if row.get("build_s") is not None else None,
        f"{row['artifact_bytes'] / 1e6:.2f} MB" if row.get("artifact_bytes") else None,
        "cached" if row.get("cached") else None]))]
    lines.append(_accuracy(row) or ("not validated (validate = false)"
                                    if row["status"] == "unvalidated" else None))
    lines = [line for line in lines if line]
    if row.get("fallback_ops"):
        lines.append(f"{row['fallback_ops']} of {row.get('ops')} ops on the CPU fallback")
    bench = row.get("bench") or {}
    if bench.get("latency_ms") is not None:
        ratio = (bench.get("ratios") or {}).get("artifact/eager")  # a time ratio
        lines.append(f"{bench['latency_ms']:.3g} ms"
                     + (f" ({phrase(1 / ratio, 'eager')})" if ratio else ""))
    elif bench.get("decode_tokens_per_s") is not None:
        ratio = (bench.get("decode_ratios") or {}).get("artifact/hf-eager")
        lines.append(f"decode {bench['decode_tokens_per_s']:.0f} tok/s"
                     + (f" ({phrase(ratio, 'transformers')})" if ratio else "")
                     + f", first token {bench['ttft_ms']:.3g} ms")
    elif bench.get("error"):
        lines.append(f"bench failed: {_first_line(bench['error'])}")
    return row["status"], lines


def _accuracy(row: dict) -> str | None:
    """The validation's worst output: SQNR for quantized builds, else its error against
    what it was allowed; a generating build: its greedy tokens against transformers', or
    its teacher-forced top-1 agreement and KL (fp16, quantized)."""
    if row.get("tokens_identical"):
        return "greedy tokens identical to transformers'"
    if row.get("top1_agreement") is not None:
        return f"top-1 {row['top1_agreement']:.1%}, KL {row['mean_kl']:.2g}"
    if row.get("min_sqnr_db") is not None:
        return f"SQNR {row['min_sqnr_db']:.1f} dB"
    if row.get("error_ratio") is not None:
        return (f"error {row['error_ratio']:.2g} of allowed"
                + (f" (max {row['max_abs_err']:.2g})" if row.get("max_abs_err") else ""))
    return None


def by_column(data: dict) -> list[dict]:
    """Per column: cells, passed, the slowest build."""
    rows = []
    for column in data["columns"]:
        mine = [r for r in data["cells"] if r["column"] == column]
        builds = [r["build_s"] for r in mine if r.get("build_s") is not None]
        rows.append({"column": column, "recipe": (data.get("recipes") or {}).get(column),
                     "target": mine[0]["target"], "dtype": mine[0]["dtype"],
                     "quantize": mine[0].get("quantize"), "cells": len(mine),
                     "passed": sum(r["status"] == "ok" for r in mine),
                     "slowest_s": max(builds, default=None)})
    return rows


def html(data: dict) -> str:
    grid = _grid(data)
    head = "".join(f"<th>{escape(c)}</th>" for c in ["model", *data["columns"]])
    body = "".join(
        f"<tr><th>{escape(model)}" + (f'<br><span class="hint">{escape(group)}</span>'
                                       if group else "") + "</th>"
        + "".join(_html_cell(grid[model].get(c)) for c in data["columns"]) + "</tr>"
        for model, group in _models(data))
    summary = "".join(
        f"<tr><td>{escape(c['column'])}</td><td>{escape(_recipe(c))}</td>"
        f"<td>{c['passed']} of {c['cells']}</td><td>{_seconds(c['slowest_s'])}</td></tr>"
        for c in by_column(data))
    totals = data["totals"]
    return _PAGE.format(
        csp=CSP, css=_CSS, title=escape(f"matrix: {data['matrix']}"),
        heading=escape(data["matrix"]),
        facts=escape(f"{len(data['models'])} models × {len(data['columns'])} targets: "
                     f"{totals['passed']} of {totals['cells']} passed, {totals['failed']} "
                     f"failed, {totals['not_run']} not run; {totals['built']} built, "
                     f"{totals['cached']} from the cache; {data['executor']} executor, "
                     f"{data['workers'] or 'all'} workers, {data['wall_s']:.0f} s"),
        machine=escape(f"{data['machine']['cpu']}, {data['machine']['cores']} cores · "
                       f"{data['versions'].get('toolchain')} · torch "
                       f"{data['versions'].get('torch')} · {data['date']}"),
        summary=summary, head=head, body=body)


def markdown(data: dict) -> str:
    """Totals per column, the grid (verdict and first detail per cell), every failure."""
    lines = ["| column | recipe | built and validated | slowest build (s) |",
             "|---|---|---|---|"]
    lines += [f"| {c['column']} | {_recipe(c)} | {c['passed']} of {c['cells']} "
              f"({100 * c['passed'] / max(1, c['cells']):.0f}%) | {_seconds(c['slowest_s'])} |"
              for c in by_column(data)]
    grid = _grid(data)
    lines += ["", "| model | group | " + " | ".join(data["columns"]) + " |",
              "|---|---|" + "---|" * len(data["columns"])]
    for model, group in _models(data):
        marks = []
        for column in data["columns"]:
            marks.append(_markdown_mark(grid[model].get(column)))
        lines.append(f"| {model} | {group or ''} | " + " | ".join(marks) + " |")
    failures = [r for r in data["cells"] if r["status"] not in ("ok", "not-run")]
    if failures:
        lines += ["", "Failures (stage, typed error, first line):", ""]
        for row in failures:
            verdict, details = cell_text(row)
            lines.append(f"- {row['model']} on {row['column']}: {verdict}: {details[0]}")
    return "\n".join(lines) + "\n"


def _markdown_mark(row: dict | None) -> str:
    """Short: "ok 12 s, 3 on CPU" or the failure's status in bold."""
    verdict, _ = cell_text(row)
    if verdict != "ok":
        return f"**{row['status']}**" if row else ""
    fallback = f", {row['fallback_ops']} on CPU" if row.get("fallback_ops") else ""
    return f"ok {_seconds(row.get('build_s'))} s{fallback}"


def _grid(data: dict) -> dict[str, dict[str, dict]]:
    grid: dict[str, dict[str, dict]] = {model: {} for model in data["models"]}
    for row in data["cells"]:
        grid[row["model"]][row["column"]] = row
    return grid


def _models(data: dict) -> list[tuple[str, str | None]]:
    groups = {r["model"]: r.get("group") for r in data["cells"]}
    return [(model, groups.get(model)) for model in data["models"]]


def _html_cell(row: dict | None) -> str:
    verdict, details = cell_text(row)
    kind = ("ok" if verdict in ("ok", "unvalidated") else "not-run" if verdict == "not run"
            else "fail")
    lines = "".join(f'<br><span class="{"why" if kind == "fail" else "hint"}">'
                    f"{escape(line)}</span>" for line in details)
    return f'<td class="cell {kind}"><b>{escape(verdict)}</b>{lines}</td>'


def _recipe(column: dict) -> str:
    """The column's own keys (target first), or for older results its target and dtype."""
    recipe = dict(column.get("recipe") or {})
    if recipe:
        return ", ".join([str(recipe.pop("target", column["target"])),
                          *(f"{k} {v}" for k, v in recipe.items())])
    return " ".join(filter(None, [column["target"], column["dtype"], column.get("quantize")]))


def _seconds(value: float | None) -> str:
    return f"{value:.0f}" if value is not None else "-"


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:300] if (text or "").strip() else ""


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<title>{title}</title><style>{css}</style></head>
<body>
<header><h1>{heading}</h1><p>{facts}</p><p class="hint">{machine}</p></header>
<section id="targets"><h2>Per target</h2><table><thead><tr><th>column</th><th>recipe</th>
<th>passed</th><th>slowest build (s)</th></tr></thead><tbody>{summary}</tbody></table></section>
<section id="matrix"><h2>Every cell</h2><table id="cells"><thead><tr>{head}</tr></thead>
<tbody>{body}</tbody></table></section>
</body></html>
"""
