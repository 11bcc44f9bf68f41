"""The executorch target's facets: what it needs installed to build and to run, and what
bisect reads inside its partitions (targets/executorch/inside.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runtime.format.manifest import Partition
from targets.facets import Packaging, Tooling
from targets.facets.packaging import PORTABLE


@dataclass(frozen=True)
class ExecutorchPackaging(Packaging):
    build_packages: tuple[tuple[str, str], ...] = (("executorch", "executorch"),)
    runtime_extra: tuple[str, tuple[str, ...]] | None = ("executorch", ("executorch>=1.5",))

    # a portable program: the .pte runs wherever the ExecuTorch runtime does
    platforms: tuple[str, ...] | None = PORTABLE

    def runtime_packages(self, partition: Partition) -> dict[str, str | None]:
        return {"executorch": partition.meta.get("executorch")}


@dataclass(frozen=True)
class ExecutorchTooling(Tooling):
    colour: str = "#e8590c"
    # ETDump logs a delegate's outputs, never the values inside it
    inside_how: str = ("ExecuTorch's ETDump debug buffer; it logs a delegate's outputs only, "
                       "so the partition was lowered again with one XNNPACK delegate per op")

    def intermediate_values(self, folder: Path, partition: Partition, wanted: dict,
                            inputs: list, shared: dict | None = None, program=None) -> list:
        if program is None:  # the .pte alone: a delegate's inner values are not logged
            return []
        from targets.executorch import inside
        return inside.intermediate_values(program, wanted, inputs,
                                          partition.meta.get("subgraphs"))
