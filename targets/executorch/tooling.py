"""What the tools around a build ask the executorch target (targets/facets/tooling.py)."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.format.manifest import Partition
from targets.facets import Tooling


_LISTED = 6  # kernel ops named in a line; the manifest's meta holds them all


@dataclass(frozen=True)
class ExecutorchTooling(Tooling):
    colour: str = "#e8590c"

    def placement_lines(self, partition: Partition) -> list[str]:
        """ExecuTorch's delegation: ops inside XNNPACK delegates, ops on its own kernels."""
        placement = partition.meta.get("placement") or {}
        if not placement:
            return []
        kernels = sorted(op for op, row in placement.items() if row.get("portable"))
        return [f"inside {partition.name}: {partition.meta.get('xnnpack_ops', 0)} op(s) in "
                f"{partition.meta.get('delegates', 0)} XNNPACK delegate(s), "
                f"{partition.meta.get('portable_ops', 0)} on ExecuTorch's own kernels"
                + (f" ({', '.join(kernels[:_LISTED])}"
                   + (f", {len(kernels) - _LISTED} more" if len(kernels) > _LISTED else "")
                   + ")" if kernels else "")]

    def memory_lines(self, partition: Partition) -> list[str]:
        """ExecuTorch's own memory planning of the partition (its arenas, planned for the
        upper bound of every dynamic dim), beside our plan's figures."""
        meta = partition.meta
        sizes = [int(s) for s in meta.get("buffer_sizes") or () if int(s) > 0]
        if meta.get("planned_bytes") is None:
            return []
        bounds = meta.get("bounds") or {}
        at = (f"the upper bound of {', '.join(f'{k} in {v}' for k, v in bounds.items())}"
              if bounds else "its static shapes")
        return [f"ExecuTorch's own arenas in {partition.name}: "
                f"{meta['planned_bytes'] / 1e6:.3f} MB in {len(sizes)} buffer(s), planned by "
                f"its memory planning for {at} (outside our plan; XNNPACK's workspace not "
                "included)"]
