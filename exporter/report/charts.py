"""Inline SVG charts for ``exporter report --html``.

Written here rather than with a plotting library: the page must be one self-contained
file whose text a browser test can inspect (tooltips, colours, labels), and these five
charts are a few rectangles each. matplotlib's SVG would embed fonts and clip paths and
carry no per-op tooltips.
"""

from __future__ import annotations

import math
from html import escape

from targets import for_backend
from targets.fallback import FALLBACK_BACKEND

# One colour per backend (the op runs there; each target declares its own, the CPU
# fallback's is here); a partition on an accelerator is drawn darker.
FALLBACK_COLOUR = "#e8590c"
OTHER_COLOUR = "#868e96"
# Arcs bulge right by how many partitions they skip, up to this: with dozens of
# partitions the graph would otherwise be thousands of pixels wide.
MAX_BULGE = 260


def placement_colour(backend: str, device: str) -> str:
    target = for_backend(backend)
    colour = (FALLBACK_COLOUR if backend == FALLBACK_BACKEND
              else target.tooling.colour if target is not None else OTHER_COLOUR)
    return colour if device == "cpu" else _darker(colour)


def _darker(colour: str, share: float = 0.6) -> str:
    red, green, blue = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{int(c * share):02x}" for c in (red, green, blue))


def _svg(width: float, height: float, body: list[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{escape(label)}" '
            f'width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}">'
            + "".join(body) + "</svg>")


def _text(x: float, y: float, text: str, *, size: int = 12, anchor: str = "start",
          fill: str = "#212529", extra: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'fill="{fill}" {extra}>{escape(text)}</text>')


def _short(names, limit: int = 3) -> str:
    names = list(names)
    return ", ".join(names[:limit]) + (f" +{len(names) - limit}" if len(names) > limit else "")


def partition_graph(partitions: list[dict], program_inputs: list[str],
                    program_outputs: list[str]) -> str:
    """Program inputs, each partition in run order, program outputs, top to bottom; an
    arc on the right for every tensor a partition reads from an earlier one (red and
    dashed where it crosses devices). Partitions are coloured by where their ops run."""
    nodes = ([{"name": "inputs", "label": "program inputs: " + _short(program_inputs),
               "outputs": program_inputs, "inputs": [], "colour": "#dee2e6", "dark": False}]
             + [{"name": p["name"], "inputs": p["inputs"], "outputs": p["outputs"],
                 "device": p["device"], "colour": placement_colour(p["backend"], p["device"]),
                 "dark": True, "label": f"{p['name']} · {p['backend']} @ {p['device']} · "
                 f"{p['ops']} op(s): {_short(p['op_kinds'], 4)}"} for p in partitions]
             + [{"name": "outputs", "label": "program outputs: " + _short(program_outputs),
                 "inputs": program_outputs, "outputs": [], "colour": "#dee2e6", "dark": False}])
    box_w, box_h, gap, left = 560, 34, 22, 10
    producer = {}
    for index, node in enumerate(nodes[:-1]):
        for tensor in node["outputs"]:
            producer.setdefault(tensor, index)
    edges: dict[tuple[int, int], list[str]] = {}
    for index, node in enumerate(nodes):
        for tensor in node["inputs"]:
            if tensor in producer and producer[tensor] < index:
                edges.setdefault((producer[tensor], index), []).append(tensor)
    body = []
    y_of = [gap + i * (box_h + gap) for i in range(len(nodes))]
    for index, node in enumerate(nodes):
        title = escape(f"{node['name']}\nreads: {', '.join(node['inputs']) or '-'}\n"
                       f"writes: {', '.join(node['outputs']) or '-'}")
        body.append(f'<g class="partition" data-name="{escape(node["name"])}"><title>{title}'
                    f'</title><rect x="{left}" y="{y_of[index]}" width="{box_w}" '
                    f'height="{box_h}" rx="6" fill="{node["colour"]}"/>'
                    + _text(left + 10, y_of[index] + 22, node["label"], size=13,
                            fill="#fff" if node["dark"] else "#212529") + "</g>")
    devices = ["cpu"] + [p["device"] for p in partitions] + ["cpu"]
    for rank, ((src, dst), tensors) in enumerate(sorted(edges.items())):
        crosses = devices[src] != devices[dst] and 0 < src and dst < len(nodes) - 1
        x0, y0 = left + box_w, y_of[src] + box_h * 0.7
        y1 = y_of[dst] + box_h * 0.3
        bulge = x0 + 30 + min(26 * (dst - src), MAX_BULGE) + 6 * (rank % 3)
        colour = "#c92a2a" if crosses else "#495057"
        dash = ' stroke-dasharray="5 3"' if crosses else ""
        label = (f"copy {devices[src]}→{devices[dst]}: " if crosses else "") + _short(tensors, 2)
        body.append(f'<g class="edge"><title>{escape(", ".join(tensors))}</title>'
                    f'<path d="M{x0},{y0:.1f} C{bulge},{y0:.1f} {bulge},{y1:.1f} {x0 + 6},'
                    f'{y1:.1f}" fill="none" stroke="{colour}" stroke-width="1.6"{dash} '
                    f'marker-end="url(#arrow)"/>'
                    + _text(bulge + 4, (y0 + y1) / 2 + 4, label, size=11, fill=colour) + "</g>")
    marker = ('<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
              'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#495057"/>'
              '</marker></defs>')
    width = left + box_w + 90 + min(26 * len(nodes), MAX_BULGE) + 160
    return _svg(width, y_of[-1] + box_h + gap, [marker, *body], "partition graph")


def op_strip(coverage: list[dict], per_row: int = 60) -> str:
    """Every op of the program in run order, one square each, coloured by where it runs;
    hovering shows the op, its node, the reason and the source line."""
    cell, pad = 12, 2
    body = []
    for index, row in enumerate(coverage):
        x, y = (index % per_row) * (cell + pad), (index // per_row) * (cell + pad)
        title = escape(f"{row['node']}: {row['op']}\n{row['backend']} @ {row['device']} "
                       f"({row.get('partition')})\n{row['reason']}"
                       + (f"\n{row['source']}" if row.get("source") else ""))
        body.append(f'<rect class="op" x="{x}" y="{y}" width="{cell}" height="{cell}" '
                    f'fill="{placement_colour(row["backend"], row["device"])}">'
                    f'<title>{title}</title></rect>')
    rows = max(1, math.ceil(len(coverage) / per_row))
    return _svg(per_row * (cell + pad), rows * (cell + pad), body, "ops in run order")


def histogram(counts: dict[str, int], bins: tuple[str, ...], marker_bin: str | None,
              caption: str) -> str:
    """Elements per error decade (bar height: log scale, the count printed on top), with
    the bin holding the allowance marked."""
    bar, gap, height, base = 34, 4, 120, 150
    biggest = max(1, max(counts.get(b, 0) for b in bins))
    body = [_text(4, 14, caption, size=12)]
    for index, name in enumerate(bins):
        count = counts.get(name, 0)
        h = height * math.log10(count + 1) / math.log10(biggest + 1) if count else 0
        x = 40 + index * (bar + gap)
        body.append(f'<rect class="bin" x="{x}" y="{base - h:.1f}" width="{bar}" '
                    f'height="{h:.1f}" fill="#1c7ed6"><title>|error| bin {escape(name)}: '
                    f'{count} element(s)</title></rect>')
        if count:
            body.append(_text(x + bar / 2, base - h - 3, str(count), size=10, anchor="middle"))
        body.append(_text(x + bar / 2, base + 14, name, size=10, anchor="middle"))
        if name == marker_bin:
            body.append(f'<line x1="{x + bar + gap / 2}" y1="24" x2="{x + bar + gap / 2}" '
                        f'y2="{base}" stroke="#c92a2a" stroke-dasharray="4 3"/>'
                        + _text(x + bar + gap, 34, "allowed", size=10, fill="#c92a2a"))
    return _svg(40 + len(bins) * (bar + gap) + 50, base + 24, body, caption)


# The latency axis ends past the largest median, or at the largest p90 when that is
# within this many medians: one slow call on a shared machine must not squeeze every
# median into a tick. A whisker past the axis is cut, ends in an arrow, and says its value.
AXIS_MEDIANS = 3.0


def nice_axis(span: float, ticks: int = 5) -> tuple[float, float]:
    """(axis end, tick step) for an axis from 0 covering ``span``: a step of 1, 2, 2.5 or
    5 times a power of ten, at most ``ticks`` steps."""
    span = span if span > 0 else 1.0
    power = 10 ** math.floor(math.log10(span / ticks))
    step = next(power * m for m in (1, 2, 2.5, 5, 10) if span / (power * m) <= ticks)
    return round(math.ceil(span / step - 1e-9) * step, 12), round(step, 12)


def latency_chart(timings: dict[str, dict], caption: str, highlight: str = "artifact") -> str:
    """Median latency per runner (bar, with a dark mark at the median) and its p10-p90
    spread (whisker), on a linear axis in ms that starts at 0, with ticks and its title."""
    medians = [t["median_ms"] for t in timings.values()]
    p90s = [t.get("p90_ms", t["median_ms"]) for t in timings.values()]
    top = max(medians, default=1.0)
    end, step = nice_axis(max(top * 1.15, min(max(p90s, default=top), AXIS_MEDIANS * top)))
    left, width, row_h, head = 150, 470, 34, 10
    height = head + len(timings) * row_h

    def x(value: float) -> float:  # ms -> px; past the axis: at its end
        return left + min(max(value, 0.0), end) / end * width
    body: list[str] = []
    for i in range(round(end / step) + 1):
        value = round(i * step, 12)
        body.append(f'<line class="grid" x1="{x(value):.1f}" y1="{head - 4}" x2="{x(value):.1f}" '
                    f'y2="{height + 4}" stroke="#dee2e6"/>'
                    + _text(x(value), height + 18, f"{value:g}", size=11, anchor="middle",
                            extra='class="tick"'))
    body.append(f'<line x1="{left}" y1="{height + 4}" x2="{left + width}" y2="{height + 4}" '
                f'stroke="#495057"/>' + _text(left + width / 2, height + 34,
                                              "latency per call (ms)", size=12, anchor="middle",
                                              extra='class="axis-title"'))
    for index, (name, timing) in enumerate(timings.items()):
        body.append(_latency_row(name, timing, head + index * row_h, x, end,
                                 "#1c7ed6" if name == highlight else "#adb5bd"))
    return (f'<div class="latency" data-axis-max-ms="{end:g}" data-plot-left="{left}" '
            f'data-plot-width="{width}">'
            + _svg(left + width + 230, height + 44, body, caption) + "</div>")


def _latency_row(name: str, timing: dict, y: float, x, end: float, colour: str) -> str:
    median = timing["median_ms"]
    low = timing.get("p10_ms", timing.get("min_ms", median))
    high = timing.get("p90_ms", median)
    mid = y + 12
    title = escape(f"{name}: median {median:.4f} ms, p10 {low:.4f} ms, p90 {high:.4f} ms, "
                   f"{timing.get('runs', '?')} calls")
    parts = [_text(x(0) - 8, mid + 4, name, anchor="end"),
             f'<rect class="bar" x="{x(0):.1f}" y="{y}" width="{max(x(median) - x(0), 1):.1f}" '
             f'height="24" fill="{colour}" fill-opacity="0.55"><title>{title}</title></rect>',
             f'<line class="whisker" x1="{x(low):.1f}" y1="{mid}" x2="{x(high):.1f}" y2="{mid}" '
             f'stroke="#212529" stroke-width="1.5"/>',
             f'<line x1="{x(low):.1f}" y1="{mid - 5}" x2="{x(low):.1f}" y2="{mid + 5}" '
             f'stroke="#212529" stroke-width="1.5"/>']
    if high > end:  # cut at the axis: an arrow says it goes on
        parts.append(f'<path class="off-scale" d="M{x(end) + 8:.1f},{mid} L{x(end):.1f},'
                     f'{mid - 5} L{x(end):.1f},{mid + 5} z" fill="#212529"/>')
    else:
        parts.append(f'<line x1="{x(high):.1f}" y1="{mid - 5}" x2="{x(high):.1f}" '
                     f'y2="{mid + 5}" stroke="#212529" stroke-width="1.5"/>')
    parts.append(f'<rect class="median" data-median-ms="{median:.6g}" x="{x(median) - 1.5:.1f}" '
                 f'y="{y - 2}" width="3" height="28" fill="#0b3d91"><title>{title}</title></rect>')
    label = (f"median {median:.4g} ms (p10 {low:.3g}, p90 {high:.3g}"
             + (", off the axis" if high > end else "") + ")")
    parts.append(_text(x(end) + 14, mid + 4, label, size=11))
    return f'<g class="runner" data-name="{escape(name)}">' + "".join(parts) + "</g>"


def timeline(live: list[int], arena: int, lower_bound: int) -> str:
    """Planned activation bytes alive at each step, with the arena and the lower bound."""
    width, height, left, top = 700, 220, 70, 14
    peak = max([arena, lower_bound, *live, 1])
    sx, sy = (width - left - 20) / max(len(live), 1), (height - top - 30) / peak

    def point(step: int, size: int) -> str:
        return f"{left + step * sx:.1f},{top + (peak - size) * sy:.1f}"
    path = " ".join(point(t, size) + " " + point(t + 1, size) for t, size in enumerate(live))
    body = [f'<polyline class="live" points="{path}" fill="none" stroke="#1c7ed6" '
            f'stroke-width="1.8"><title>live activations per step</title></polyline>']
    # labels at opposite ends: the two lines meet when the plan wastes nothing
    for value, colour, name, x, anchor in ((arena, "#c92a2a", "arena", width - 22, "end"),
                                           (lower_bound, "#2f9e44", "lower bound", left + 4,
                                            "start")):
        y = top + (peak - value) * sy
        body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - 20}" y2="{y:.1f}" '
                    f'stroke="{colour}" stroke-dasharray="6 3"/>'
                    + _text(x, y - 4, f"{name} {value / 1e6:.3f} MB", size=11, anchor=anchor,
                            fill=colour))
    body.append(_text(4, top + 8, f"{peak / 1e6:.3f} MB", size=10)
                + _text(4, height - 30, "0", size=10)
                + _text(left, height - 10, f"step (node of the ATen graph), 0..{len(live) - 1}",
                        size=11))
    return _svg(width, height, body, "memory timeline")
