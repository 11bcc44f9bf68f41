"""The toy target's executor kind, ``toy-relu``: its typed partition metadata and the
executor that runs it. tests/toy_target/register.py registers it with the runtime (a
plug-in package would do so through the ``edge_exporter.executors`` entry point)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from runtime.executors.meta import Entry, PartitionMeta
from runtime.format.manifest import Partition

BACKEND = "toy-relu"


@dataclass(frozen=True)
class ToyMeta(PartitionMeta):
    program: Entry  # the partition's file (how many relus it applies)
    relus: int


class ToyExecutor:
    Meta = ToyMeta
    arena_slots = 0

    def __init__(self, relus: int) -> None:
        self.relus = relus

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.relu(t) for t in inputs]

    def report(self) -> dict:
        return {"relus": self.relus}

    @classmethod
    def load(cls, partition: Partition, meta: ToyMeta, files_dir: Path, *, where: str,
             **_: object) -> "ToyExecutor":
        spec = json.loads((files_dir / meta.program).read_text())
        return cls(int(spec["relus"]))
