"""The report's performance section, from an ``exporter bench --json`` result: the latency
chart, the machine and inputs it was measured on, each partition's time inside the
runtime, and the nodes a backend's own profiler timed (ONNX Runtime)."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

from exporter.errors import UserInputError
from exporter.report import charts
from exporter.report.page import ms, prose, share_bar, table
from exporter.report.speed import phrase, speedups
from exporter.report.validation import number
from runtime.format.manifest import Manifest


def read_bench(path: Path) -> dict:
    """An ``exporter bench --json`` result, checked enough to draw; UserInputError else."""
    try:
        data = json.loads(path.read_text())
        if "engines" in data:  # a generating artifact's: tokens per second per engine
            return _checked_generation(data)
        timings = data["timings"]
        if not all(isinstance(t["median_ms"], (int, float)) for t in timings.values()):
            raise TypeError("median_ms is not a number")
        for key in ("machine", "partitions", "ops"):
            if not isinstance(data.get(key, {}), dict):
                raise TypeError(f"{key} is not an object")
        return data
    except OSError as exc:
        raise UserInputError(f"cannot read the bench result ({exc.strerror})",
                             where=str(path)) from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserInputError(f"not an `exporter bench --json` result ({exc})", where=str(path),
                             hint="write one with: exporter bench ARTIFACT --json > bench.json"
                             ) from None


def _checked_generation(data: dict) -> dict:
    """A generating artifact's bench: the artifact's engine first, each with its rates."""
    engines = data["engines"]
    if "artifact" not in engines:
        raise KeyError("engines.artifact")
    for engine in engines.values():
        if not all(isinstance(engine[key], (int, float)) and not isinstance(engine[key], bool)
                   for key in ("decode_tokens_per_s", "ttft_s")):
            raise TypeError("decode_tokens_per_s or ttft_s is not a number")
    return data


def latency_section(bench: dict | None, manifest: Manifest) -> str:
    if bench is None:
        return ('<section id="latency"><h2>Latency</h2><p class="hint">not measured: pass '
                "<code>--bench FILE</code> from <code>exporter bench ARTIFACT --json</code>"
                "</p></section>")
    if "engines" in bench:
        return _generation(bench)
    ratios = ", ".join(phrase(value, name) for name, value in speedups(bench).items())
    chart = charts.latency_chart(bench["timings"], "latency per call in ms")
    return ('<section id="latency"><h2>Latency</h2>'
            f"<p>{prose(bench.get('runs'))} calls per runner after "
            f"{prose(bench.get('warmup'))} untimed, interleaved, timer "
            f"{prose(bench.get('timer'))}; bar: median, whisker: p10 to p90"
            + (f"; the artifact ran {prose(ratios)}" if ratios else "")
            + f'</p><div class="side">{chart}{conditions(bench)}</div>'
            + _partitions(bench, manifest) + _ops(bench) + "</section>")


def _generation(bench: dict) -> str:
    """A generating artifact's bench: per engine (the artifact, transformers' eager and
    static-cache generate), the first token's time and the prefill and decode rates."""
    engines = bench["engines"]
    fastest = max(e["decode_tokens_per_s"] for e in engines.values()) or 1.0
    rows = [[escape(name), escape(ms(e["ttft_s"] * 1e3)),
             escape(number(e.get("prefill_tokens_per_s"), ".1f")),
             share_bar(e["decode_tokens_per_s"], fastest, f"{e['decode_tokens_per_s']:.1f}"),
             escape(f"{e.get('peak_gpu_mb') or e.get('peak_rss_mb') or '-'}")]
            for name, e in engines.items()]
    ratios = ", ".join(phrase(value, name) for name, value in speedups(bench).items())
    return ('<section id="latency"><h2>Generation speed</h2>'
            f"<p>{prose(bench.get('prompt_tokens'))}-token prompt, "
            f"{prose(bench.get('new_tokens'))} new tokens, median of {prose(bench.get('runs'))} "
            f"runs on {prose(bench.get('device'))} ({prose(bench.get('threads'))} threads)"
            + (f"; the artifact decodes {prose(ratios)}" if ratios else "")
            + "</p>" + table(["engine", "first token", "prefill tokens/s", "decode tokens/s",
                              "peak MB"], rows, cls="generation-speed", raw=True)
            + "</section>")


def conditions(bench: dict) -> str:
    """The machine, threads, versions and inputs the latencies were measured with."""
    if "engines" in bench:  # a generating artifact's bench: its device, threads, lengths
        return '<div class="conditions">' + table(["measured on", ""], [
            ["device", f"{bench.get('device')} ({bench.get('dtype')})"],
            ["threads", str(bench.get("threads"))],
            ["generation", f"{bench.get('prompt_tokens')}-token prompt, "
                           f"{bench.get('new_tokens')} new tokens, {bench.get('runs')} runs"]]
        ) + "</div>"
    host = bench.get("machine") or {}
    threads = ", ".join(f"{name} {_threads(value)}"
                        for name, value in (host.get("threads") or {}).items())
    versions = ", ".join(f"{name} {value}" for name, value in (host.get("versions") or {}).items())
    shapes = "; ".join(f"{i.get('name')}: {i.get('dtype')}{i.get('shape')}"
                       for i in bench.get("inputs") or [])
    rows = [["device", f"{bench.get('device')} ({bench.get('dtype')})"
             + (", CUDA graphs" if bench.get("cuda_graphs") else "")],
            ["CPU", f"{host.get('cpu', '?')}, {host.get('cores', '?')} cores"
             + (f" ({host['usable_cores']} usable)" if host.get("usable_cores") not in
                (None, host.get("cores")) else "")],
            ["threads", threads or "?"], ["GPU", host.get("gpu") or bench.get("gpu") or "none"],
            ["OS", host.get("os", "?")], ["versions", versions or "?"],
            ["inputs", shapes or "?"]]
    if not host:
        rows.append(["note", "this bench result predates machine details: run exporter "
                             "bench again"])
    return '<div class="conditions">' + table(["measured on", ""], rows) + "</div>"


def _threads(value) -> str:
    return "default (one per physical core)" if value == 0 else str(value)


def _partitions(bench: dict, manifest: Manifest) -> str:
    parts = bench.get("partitions")
    if not parts:
        return ("<h3>Time per partition</h3><p class=\"hint\">this bench result predates "
                "per-partition times: run <code>exporter bench</code> again</p>")
    ops = {}
    for row in manifest.coverage:
        ops[row.get("partition")] = ops.get(row.get("partition"), 0) + 1
    total = bench["timings"]["artifact"]["median_ms"]
    rows = []
    for name, t in parts.items():
        colour = charts.placement_colour(t.get("backend", ""), t.get("device", "cpu"))
        rows.append([f'<span class="chip" style="background:{colour}">{escape(name)}</span>',
                     escape(f"{t.get('backend')} @ {t.get('device')}"), ops.get(name, 0),
                     share_bar(t["median_ms"], total, ms(t["median_ms"])),
                     escape(f"{t.get('p10_ms', 0):.4g} to {t.get('p90_ms', 0):.4g} ms")])
    rows.append(_around(total, sum(t["median_ms"] for t in parts.values())))
    return ("<h3>Time per partition</h3><p>each partition's executor call timed inside the "
            "runtime (device events on a GPU), median over the calls; bars are shares of the "
            f"artifact's median {escape(ms(total))}</p>"
            + table(["partition", "runs on", "ops", "median", "p10 to p90"], rows,
                    cls="partition-times", raw=True))


def _around(total: float, inside: float) -> list:
    """The runtime's own time: the artifact's median less its partitions'. Medians of
    separate runs do not add up exactly; where the partitions' sum is the larger, the
    difference is noise, said so, never a negative time."""
    rest = total - inside
    if rest >= 0:
        return ["runtime around them", "checks, hand-offs, output copies", "",
                share_bar(rest, total, ms(rest)), "artifact median − partitions"]
    return ["runtime around them", "checks, hand-offs, output copies", "",
            share_bar(0.0, total, "too small to measure"),
            f"the partitions' medians add up to {ms(inside)}, {ms(-rest)} more than the "
            "artifact's (separate runs' noise)"]


def _ops(bench: dict) -> str:
    """Per partition, the nodes its backend's profiler timed, slowest first."""
    blocks = []
    for partition, rows in (bench.get("ops") or {}).items():
        if not rows:
            continue
        largest = max(r["median_ms"] for r in rows)
        cells = [[escape(r.get("node", "")), escape(r.get("op", "")),
                  escape(r.get("provider", "")),
                  share_bar(r["median_ms"], largest, ms(r["median_ms"]))] for r in rows]
        blocks.append(f"<details><summary>{escape(partition)}: {len(rows)} node(s) timed by "
                      "the backend's profiler, slowest first</summary>"
                      + table(["node", "kernel", "provider", "median"], cells, cls="op-times",
                              raw=True) + "</details>")
    if not blocks:
        return ""
    return ("<h3>Time per node</h3><p class=\"hint\">from the backend's own profiler in a "
            "second, profiled session (the kernels it ran, after its own fusion; on nodes "
            "this small the profiler's own cost shows, so read the shares, not the sum)</p>"
            + "".join(blocks))
