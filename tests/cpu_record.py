"""Per-test CPU seconds, on request: ``EDGE_TEST_CPU=FOLDER make test`` writes one
tab-separated line per test (id, CPU s, wall s) to FOLDER/<worker>.tsv. CPU is user + sys
of the test's process and every live descendant (validation templates, builds, native
runners), children they reaped included, measured before setup and after teardown: the
suite is CPU-bound on two cores (docs/testing.md), so these are the figures to cut."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest


def _tree_cpu() -> float:
    import psutil
    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:  # ended meanwhile: its parent's children_* will hold it
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class CpuRecord:
    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self._out = open(folder / f"{worker}.tsv", "a", buffering=1)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        cpu, wall = _tree_cpu(), time.perf_counter()
        yield
        self._out.write(f"{item.nodeid}\t{_tree_cpu() - cpu:.2f}\t"
                        f"{time.perf_counter() - wall:.2f}\n")


def register(config) -> None:
    folder = os.environ.get("EDGE_TEST_CPU")
    if folder:
        config.pluginmanager.register(CpuRecord(Path(folder)), "edge-cpu-record")
