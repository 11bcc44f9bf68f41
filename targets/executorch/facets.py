"""The executorch target's packaging facet: what it needs installed to build and to run."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.format.manifest import Partition
from targets.facets import Packaging


@dataclass(frozen=True)
class ExecutorchPackaging(Packaging):
    build_packages: tuple[tuple[str, str], ...] = (("executorch", "executorch"),)
    runtime_extra: tuple[str, tuple[str, ...]] | None = ("executorch", ("executorch>=1.5",))

    def runtime_packages(self, partition: Partition) -> dict[str, str | None]:
        return {"executorch": partition.meta.get("executorch")}
