"""The executorch target's packaging facet: what it needs installed to build and to run."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.format.manifest import Partition
from targets.facets import Packaging
from targets.facets.packaging import PORTABLE


@dataclass(frozen=True)
class ExecutorchPackaging(Packaging):
    build_packages: tuple[tuple[str, str], ...] = (("executorch", "executorch"),)
    runtime_extra: tuple[str, tuple[str, ...]] | None = ("executorch", ("executorch>=1.5",))

    # a portable program: the .pte runs wherever the ExecuTorch runtime does
    platforms: tuple[str, ...] | None = PORTABLE

    def runtime_packages(self, partition: Partition) -> dict[str, str | None]:
        return {"executorch": partition.meta.get("executorch")}
