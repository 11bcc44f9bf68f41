"""The onnx target's optional facets: the packages it needs, and what bisect, bench and
the report read inside its partitions (targets/onnx/inside.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from runtime.format.manifest import Partition
from targets.facets import Baseline, Packaging, Tooling
from targets.facets.packaging import PORTABLE
from targets.onnx.card import LOGGERS_TO_QUIET
from targets.onnx import inside


@dataclass(frozen=True)
class OnnxPackaging(Packaging):
    build_packages: tuple[tuple[str, str], ...] = (("onnxruntime", "onnx"),
                                                   ("onnxscript", "onnx"))
    # not onnxruntime: importing it starts a thread, which a fork would not carry over
    build_modules: tuple[str, ...] = ("torch.onnx._internal.exporter._core",
                                      "onnxscript.rewriter", "onnx")
    runtime_extra: tuple[str, tuple[str, ...]] | None = ("onnx", ("onnxruntime>=1.18",))

    # a portable program: ONNX Runtime runs it on each platform
    platforms: tuple[str, ...] | None = PORTABLE

    def runtime_packages(self, partition: Partition) -> dict[str, str | None]:
        return {"onnxruntime": partition.meta.get("onnxruntime")}


@dataclass(frozen=True)
class OnnxTooling(Tooling):
    colour: str = "#1c7ed6"
    loggers_to_quiet: tuple[str, ...] = LOGGERS_TO_QUIET

    def intermediate_values(self, folder: Path, partition: Partition, wanted: dict,
                            inputs: list, shared: dict | None = None, program=None
                            ) -> list[tuple[str, str, torch.Tensor]]:
        return inside.intermediate_values(folder / partition.meta["model"], wanted, inputs,
                                          shared or {}, _kernels(folder, partition))

    def op_times(self, folder: Path, partition: Partition, inputs: list, runs: int
                 ) -> list[dict]:
        return inside.node_times(folder / partition.meta["model"], inputs, runs,
                                 partition.meta.get("providers"), _kernels(folder, partition))

    def graph_nodes(self, read, partition: Partition, limit: int) -> list[dict] | None:
        return inside.graph_nodes(read(partition.meta["model"]), limit)

    def baselines(self) -> dict[str, Baseline]:
        return {"onnxruntime": inside.direct_session}


def _kernels(folder: Path, partition: Partition) -> Path | None:
    """The partition's own kernel library (targets/onnx/kernels), where it has one."""
    library = partition.meta.get("kernels")
    return folder / library if library else None
