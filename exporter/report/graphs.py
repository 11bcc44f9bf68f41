"""The report's view of each partition's own graph, read from the artifact's files: the
ONNX graph of an ONNX Runtime partition, the ATen graph of a CPU-fallback one (its target
reads them: ``Tooling.graph_nodes``), as a table of nodes with op, tensor types and edges
(each input names the node that produced it, as a link). Compiled partitions (a shared
library) hold no readable graph: the ATen ops they were built from are listed instead."""

from __future__ import annotations

import functools
from html import escape

from exporter.report import charts
from exporter.report.page import program_blocks
from runtime.format.manifest import Manifest, Partition
from targets import for_backend
from targets.fallback import FALLBACK_BACKEND
from targets.fallback_graph import graph_nodes as fallback_nodes

# Nodes shown per partition: a transformer's ONNX graph has thousands, the page must open.
MAX_NODES = 1500


def read_graphs(manifest: Manifest, reader) -> dict[str, list[dict] | None]:
    """Partition name -> its graph's node rows (None: no readable graph). ``reader``: the
    open, verified ArtifactReader. A graph that does not parse is reported, not fatal."""
    graphs = {}
    for partition in manifest.all_partitions():  # entry points' partitions have own names
        try:
            graphs[partition.name] = _nodes(partition, reader.read_bytes)
        except Exception as exc:  # noqa: BLE001 - a report must not die on one odd file
            graphs[partition.name] = [{"name": "(unreadable)", "op": type(exc).__name__,
                                       "origin": str(exc)[:200], "inputs": [], "outputs": []}]
    return graphs


def _nodes(partition: Partition, read) -> list[dict] | None:
    if partition.backend == FALLBACK_BACKEND:
        return fallback_nodes(read(partition.meta["program"]), MAX_NODES + 1)
    target = for_backend(partition.backend)
    return target.tooling.graph_nodes(read, partition, MAX_NODES + 1) if target else None


def graphs_section(programs: list[tuple[str | None, Manifest]],
                   graphs: dict[str, list[dict] | None]) -> str:
    """Each program's partitions (a generating artifact's prefill, decode, encode)."""
    return ('<section id="graphs"><h2>Inside each partition</h2><p class="hint">each input '
            "names the node that wrote it (a link); a grey input is a stored weight; "
            "<i>from</i>: the ATen node it was translated from</p>"
            + program_blocks(programs, functools.partial(_blocks, graphs=graphs))
            + "</section>")


def _blocks(manifest: Manifest, graphs: dict[str, list[dict] | None]) -> str:
    blocks = []
    for partition in manifest.partitions:
        nodes = graphs.get(partition.name)
        colour = charts.placement_colour(partition.backend, partition.device)
        title = (f'<span class="chip" style="background:{colour}">{escape(partition.name)}'
                 f"</span> {escape(partition.backend)} @ {escape(partition.device)}: ")
        if nodes is None:
            ops = [r for r in manifest.coverage if r.get("partition") == partition.name]
            listing = "".join(f"<tr><td>{escape(r['node'])}</td><td>{escape(r['op'])}</td></tr>"
                              for r in ops)
            blocks.append(f'<details class="graph-view" data-partition="{escape(partition.name)}">'
                          f"<summary>{title}compiled code, no graph inside; the {len(ops)} ATen "
                          f"op(s) it was built from</summary><table><thead><tr><th>node</th>"
                          f"<th>op</th></tr></thead><tbody>{listing}</tbody></table></details>")
            continue
        kind = "ATen graph (torch export JSON)" if partition.backend == FALLBACK_BACKEND \
            else "graph as the backend runs it"
        more = len(nodes) > MAX_NODES
        blocks.append(f'<details class="graph-view" data-partition="{escape(partition.name)}">'
                      f"<summary>{title}{kind}, {len(nodes[:MAX_NODES])}"
                      f"{'+' if more else ''} node(s)</summary>"
                      + _node_table(partition, nodes[:MAX_NODES])
                      + (f"<p class=\"hint\">the first {MAX_NODES} nodes</p>" if more else "")
                      + "</details>")
    return "".join(blocks)


def _node_table(partition: Partition, nodes: list[dict]) -> str:
    # tensor name -> (the row of the node that wrote it, that node's name)
    producers = {o["name"]: (f"g-{partition.name}-{i}", node["name"])
                 for i, node in enumerate(nodes) for o in node["outputs"]}
    rows = []
    for i, node in enumerate(nodes):
        inputs = "<br>".join(_tensor(t, producers) for t in node["inputs"]) or "-"
        outputs = "<br>".join(f"{escape(t['name'])} <span class=\"w\">{escape(t['type'])}</span>"
                              for t in node["outputs"])
        origin = f"<br><i>from</i> {escape(node['origin'])}" if node.get("origin") else ""
        rows.append(f'<tr id="g-{escape(partition.name)}-{i}"><td>{escape(node["name"])}'
                    f"{origin}</td><td>{escape(node['op'])}</td><td>{inputs}</td>"
                    f"<td>{outputs}</td></tr>")
    return ('<table class="graph"><thead><tr><th>node</th><th>op</th><th>inputs (from)</th>'
            f"<th>outputs</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _tensor(tensor: dict, producers: dict[str, tuple[str, str]]) -> str:
    text = f"{escape(tensor['name'])} <span class=\"w\">{escape(tensor['type'])}</span>"
    if tensor.get("weight"):
        return f'<span class="w">{text}</span>'
    if tensor["name"] in producers:
        row, producer = producers[tensor["name"]]
        return f'{text} ← <a href="#{escape(row)}">{escape(producer)}</a>'
    return f"{text} ← (partition input)"
