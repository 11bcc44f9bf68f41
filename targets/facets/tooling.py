"""What the tools around a build ask a target: ``exporter doctor``, bisect, ``exporter
bench``, ``exporter report`` and the CLI's log output."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch.export import ExportedProgram

from runtime.format.manifest import Partition
from targets.card import ABSENT, OK, PROBLEM, Check  # noqa: F401  doctor's rows, light

# A bench baseline: (artifact's Program, flat inputs) -> a callable timed like the artifact.
Baseline = Callable[[object, list], Callable[[], object]]


@dataclass(frozen=True)
class Tooling:
    colour: str = "#868e96"  # the report's colour for ops placed here
    loggers_to_quiet: tuple[str, ...] = ()  # chatty third-party loggers (the CLI quiets them)
    inside_how: str = ""  # how ``intermediate_values`` obtains them, for bisect's lines

    def doctor_checks(self) -> list[Check]:
        """Rows for `exporter doctor` beyond its packages and availability."""
        return []

    def intermediate_values(self, folder: Path, partition: Partition,
                            wanted: dict[str, torch.dtype], inputs: list,
                            shared: dict[str, torch.Tensor] | None = None,
                            program: ExportedProgram | None = None
                            ) -> list[tuple[str, str, torch.Tensor]]:
        """For bisect, once it has blamed one of this target's partitions (its files
        extracted under ``folder``): ``(backend op, value name, value)`` for the values of
        ``wanted`` (node name of the partition's program -> dtype) the backend can expose,
        run on ``inputs``, in its own graph order. ``shared``: the tensors the partition
        reads from the artifact's shared store, by the names its meta gives them.
        ``program``: the partition's program as it was handed to ``lower``, for a target
        that must lower it again to look inside. Empty where it cannot say; the exporter
        compares them with eager's."""
        return []

    def op_times(self, folder: Path, partition: Partition, inputs: list, runs: int
                 ) -> list[dict]:
        """For `exporter bench`: each node's time inside one of this target's partitions
        (its files extracted under ``folder``), from the backend's own profiler, over
        ``runs`` calls on ``inputs``: rows ``{node, op, median_ms, calls}`` and, where the
        backend says, ``provider``. Empty where it cannot say (bench then skips the copy)."""
        return []

    def graph_nodes(self, read: Callable[[str], bytes], partition: Partition, limit: int
                    ) -> list[dict] | None:
        """For `exporter report`: the graph one of this target's partitions runs, read from
        its files (``read(entry name) -> bytes``, verified), as at most ``limit`` rows
        ``{name, op, inputs, outputs, origin}`` (tensors as ``{name, type, weight}``;
        ``origin`` the ATen node it came from, or ""). None where the files hold no
        readable graph (a compiled library): the report lists the ATen ops instead."""
        return None

    def baselines(self) -> dict[str, Baseline]:
        """Extra `exporter bench` baselines this target's artifacts can be timed against."""
        return {}
