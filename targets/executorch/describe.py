"""What `exporter inspect` and the report say inside an executorch partition, read from
its meta alone (no torch, no executorch): the target's card points here."""

from __future__ import annotations

from runtime.format.manifest import Partition

_LISTED = 6  # kernel ops named in a line; the manifest's meta holds them all


def placement_lines(partition: Partition) -> list[str]:
    """ExecuTorch's delegation: ops inside XNNPACK delegates, ops on its own kernels."""
    meta = partition.meta
    placement = meta.get("placement") or {}
    if not placement:
        return []
    kernels = sorted(op for op, row in placement.items() if row.get("portable"))
    listed = ""
    if kernels:
        more = f", {len(kernels) - _LISTED} more" if len(kernels) > _LISTED else ""
        listed = f" ({', '.join(kernels[:_LISTED])}{more})"
    return [f"inside {partition.name}: {meta.get('xnnpack_ops', 0)} op(s) in "
            f"{meta.get('delegates', 0)} XNNPACK delegate(s), "
            f"{meta.get('portable_ops', 0)} on ExecuTorch's own kernels{listed}",
            *_subgraph_lines(partition.name, meta.get("subgraphs") or [])]


def _subgraph_lines(name: str, subgraphs: list) -> list[str]:
    """The nodes inside each XNNPACK subgraph, in run order (what bisect and a profile's
    one-event-per-delegate refer to)."""
    if not subgraphs:
        return []
    shown = []
    for index, ops in enumerate(subgraphs[:_LISTED]):
        more = f", {len(ops) - _LISTED} more" if len(ops) > _LISTED else ""
        shown.append(f"{index}: {', '.join(ops[:_LISTED])}{more}")
    rest = (f"; {len(subgraphs) - _LISTED} more subgraph(s)" if len(subgraphs) > _LISTED
            else "")
    return [f"XNNPACK subgraphs of {name} in run order: {'; '.join(shown)}{rest}"]


def memory_lines(partition: Partition) -> list[str]:
    """ExecuTorch's own memory planning of the partition (its arenas, planned for the
    upper bound of every dynamic dim), beside our plan's figures."""
    meta = partition.meta
    if meta.get("planned_bytes") is None:
        return []
    sizes = [int(s) for s in meta.get("buffer_sizes") or () if int(s) > 0]
    bounds = meta.get("bounds") or {}
    at = (f"the upper bound of {', '.join(f'{k} in {v}' for k, v in bounds.items())}"
          if bounds else "its static shapes")
    return [f"ExecuTorch's own arenas in {partition.name}: "
            f"{meta['planned_bytes'] / 1e6:.3f} MB in {len(sizes)} buffer(s), planned by "
            f"its memory planning for {at} (outside our plan; XNNPACK's workspace not "
            "included)"]
