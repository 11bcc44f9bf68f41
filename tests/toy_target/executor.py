"""The toy target's executor kind, ``toy-relu``: its typed partition metadata and the
executor that runs it. Importing this module registers the kind with the runtime (a
plug-in package would do so through the ``edge_exporter.executors`` entry point)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from runtime.executors import register_executor
from runtime.manifest import Partition

BACKEND = "toy-relu"


@dataclass(frozen=True)
class ToyMeta:
    program: str  # the partition's file (how many relus it applies)
    relus: int

    def to_json(self) -> dict:
        return {"program": self.program, "relus": self.relus}


class ToyExecutor:
    def __init__(self, relus: int) -> None:
        self.relus = relus

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.relu(t) for t in inputs]

    def report(self) -> dict:
        return {"relus": self.relus}


def load(partition: Partition, files_dir: Path, *, where: str, **_: object) -> ToyExecutor:
    spec = json.loads((files_dir / partition.meta["program"]).read_text())
    return ToyExecutor(int(spec["relus"]))


FILE_KEYS = ("program",)
register_executor(BACKEND, __name__)
