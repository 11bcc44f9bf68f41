"""``exporter matrix``: every (model, target recipe) cell built, validated, benched when
asked, cached, and written up as one table.

Cells whose key is in the cache are not run; the rest go to the executor, and each
result is stored in the cache as it arrives, so a matrix that is interrupted (Ctrl-C, a
lost machine) and run again picks up where it stopped. The table (matrix.json, .csv and
.html) is written at the end, and also when the run is cut short (cells not run yet say so).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

from exporter.config import config_file
from exporter.matrix import cache as cache_keys
from exporter.matrix import executors, results, spec_file, warm
from exporter.matrix import folder as output_folder
from exporter.matrix.cache import Cache
from exporter.matrix.cell import Job
from exporter.matrix.spec_file import Cell, Matrix
from runtime.host.hostinfo import usable_cores

@dataclass
class Board:
    """What the terminal shows while the matrix runs."""
    total: int
    started: float = field(default_factory=time.monotonic)
    # when the run began, its cells were planned (keys, cache), and the executor took
    # its first cell (after starting Ray or the pool): epoch seconds, for matrix.json
    marks: dict[str, float] = field(default_factory=lambda: {"started_at": time.time()})
    done: int = 0
    failed: int = 0
    cached: int = 0
    built: int = 0
    running: dict[str, float] = field(default_factory=dict)  # cell id -> when it started
    slowest: tuple[str, float] | None = None  # the slowest finished build: (cell, seconds)


Progress = Callable[[str, Board, str, dict | None], None]  # (event, board, cell id, row)


def default_workers() -> int:
    """Half the cores, at least two where there are two: a build spends part of its time
    starting processes, importing and waiting on its validation subprocess, so even two
    cores are kept busier by two cells than by one."""
    cores = usable_cores()
    return min(cores, max(2, cores // 2))


def run_matrix(path: Path, out: Path, *, executor: str = "local", workers: int | None = None,
               ray_address: str | None = None, cache: Path | None = None,
               rebuild: bool = False, progress: Progress | None = None) -> dict:
    """Run the matrix file at ``path`` into ``out``; return what matrix.json holds."""
    matrix = spec_file.read(Path(path))
    out = Path(out).resolve()
    # a folder of the user's is refused before any work; the matrix's own is reused
    output_folder.check(out, [c.id for c in matrix.cells], own_cache=cache is None)
    output_folder.claim(out, own_cache=cache is None)
    store = Cache(Path(cache).resolve() if cache else out / "cache")
    tools = cache_keys.toolchain({c.settings.target for c in matrix.cells})
    run = _Run(matrix, out, store, progress or (lambda *_: None))
    workers = workers or (None if ray_address else default_workers())
    jobs = longest_first(run.plan(tools, rebuild, threads=max(1, usable_cores() // workers)
                                  if workers else 1, warm_modules=_warm_modules(matrix)),
                         store.durations())
    run.board.marks["planned_at"] = time.time()
    # no jobs (the cache answered every cell): no executor to start. A cluster that cannot
    # be joined stops the command before the table is written: the last run's stays.
    ray = executors.connect_ray(workers, ray_address) if jobs and executor == "ray" else None
    try:
        if ray is not None:
            executors.run_ray(ray, jobs, workers, matrix.retries, run.started, run.done)
        elif jobs:
            executors.run_local(jobs, workers or 1, run.started, run.done)
    finally:
        store.record_durations(run.seconds)
        data = run.table(executor, workers, next(iter(tools.values()), {}))
        results.write_all(out, data)
    return data


def longest_first(jobs: list[Job], seconds: dict[str, float]) -> list[Job]:
    """The order cells start in: cells never built before first (their time is unknown,
    and a long one started last would leave every other worker idle), then the rest by
    their last build time, longest first. Any order ends within one cell's time of the
    total over N workers; longest first makes the cells that end last short ones
    (longest-processing-time scheduling). In file order, 8 workers over 12 cells took
    3.9x the loop where 8x was the aim."""
    known = sorted((job for job in jobs if job.cell_id in seconds),
                   key=lambda job: -seconds[job.cell_id])
    return [job for job in jobs if job.cell_id not in seconds] + known


class _Run:
    def __init__(self, matrix: Matrix, out: Path, store: Cache, progress: Progress) -> None:
        self.matrix, self.out, self.store, self.progress = matrix, out, store, progress
        self.cells = {cell.id: cell for cell in matrix.cells}
        self.keys: dict[str, str | None] = {}
        self.hits: dict[str, dict] = {}
        self.rows: dict[str, dict] = {}
        self.board = Board(len(matrix.cells))
        self.seconds: dict[str, float] = {}  # cell id -> its build's time, this run

    def plan(self, tools: dict, rebuild: bool, threads: int,
             warm_modules: tuple[str, ...] | None) -> list[Job]:
        """Jobs for the cells the cache cannot answer; the hits go straight to the table."""
        bench = self.matrix.bench.model_dump() if self.matrix.bench else None
        jobs = []
        for cell in self.matrix.cells:
            key = self.keys[cell.id] = cache_keys.cell_key(cell, tools)
            config = config_file.write(self.out / "cells" / f"{cell.id}.toml", cell.spec,
                                       cell.settings)
            hit = self.store.lookup(key) if key and not rebuild else None
            if hit is not None and bench is None:  # a bench of an earlier [bench] is not shown
                hit = {k: v for k, v in hit.items() if k != "bench"}
            if hit is not None and not _needs_bench(hit, bench):
                self._finish(cell, {**hit, "cached": True})
                continue
            if hit is not None:
                self.hits[cell.id] = hit
            artifact = self.store.artifact(key) if key else self._link(cell)
            device = _device(cell)
            warm = warm_modules if _warm_for(self.matrix.warm_start, device) else None
            jobs.append(Job(cell.id, str(config), str(artifact),
                            str(self.out / "running" / f"{cell.id}.json"), os.getcwd(),
                            self.matrix.timeout, threads, bench, build=hit is None,
                            device=device, warm_modules=warm))
        return jobs

    def started(self, job: Job) -> None:
        self.board.marks.setdefault("first_submitted_at", time.time())
        self.board.running[job.cell_id] = time.monotonic()
        self.progress("start", self.board, job.cell_id, None)

    def done(self, job: Job, row: dict) -> None:
        cell = self.cells[job.cell_id]
        self.board.running.pop(job.cell_id, None)
        with contextlib.suppress(FileNotFoundError):
            Path(job.running).unlink()
        if job.build:
            self.board.built += 1
            if row.get("build_s") is not None:
                self.seconds[job.cell_id] = row["build_s"]
            row = {**row, "cached": False}
        else:  # a cached build, benched now
            row = {**self.hits[job.cell_id], "bench": row.get("bench"), "cached": True}
        row = {**_identity(cell, self.keys[cell.id]), **row}
        if self.keys[cell.id]:
            self.store.store(self.keys[cell.id], row)
        self._finish(cell, row)

    def _finish(self, cell: Cell, row: dict) -> None:
        row = {**row, **_identity(cell, self.keys[cell.id])}
        if row.get("cached"):  # its build ran in an earlier matrix, not on this timeline
            row.pop("ran", None)
        artifact = self.store.artifact(row["key"]) if row["key"] else None
        if artifact is not None and row.get("artifact_sha256") and artifact.is_file():
            _link_file(artifact, self._link(cell))
        if row.get("artifact_sha256"):
            row["artifact"] = str(self._link(cell))
        elif row["key"]:  # no artifact now: an earlier run's link would pass for this one's
            self._link(cell).unlink(missing_ok=True)
        self.rows[cell.id] = row
        board = self.board
        board.done += 1
        board.cached += bool(row.get("cached"))
        board.failed += row.get("status") != "ok"
        if not row.get("cached") and row.get("build_s") is not None and (
                board.slowest is None or row["build_s"] > board.slowest[1]):
            board.slowest = (cell.id, row["build_s"])
        self.progress("done", board, cell.id, row)

    def _link(self, cell: Cell) -> Path:
        return self.out / "artifacts" / f"{cell.id}.artifact"

    def table(self, executor: str, workers: int | None, versions: dict) -> dict:
        rows = [self.rows.get(cell.id) or {**_identity(cell, self.keys.get(cell.id)),
                                           "status": "not-run"}
                for cell in self.matrix.cells]
        return results.table(self.matrix, rows, executor=executor, workers=workers,
                             wall_s=time.monotonic() - self.board.started,
                             marks=self.board.marks,
                             built=self.board.built, versions=versions)


def _identity(cell: Cell, key: str | None) -> dict:
    settings = cell.settings
    return {"model": cell.model, "group": cell.group, "column": cell.column,
            "target": settings.target, "dtype": settings.dtype, "quantize": settings.quantize,
            "spec": cell.spec, "key": key}


def _needs_bench(hit: dict, bench: dict | None) -> bool:
    """A cached build that passed, benched with other settings, never, or without a
    result (a bench that timed out or crashed is run again, as a build would be)."""
    benched = hit.get("bench") or {}
    return (bench is not None and hit.get("status") == "ok"
            and (benched.get("settings") != bench or "error" in benched))


def _device(cell: Cell) -> str:
    from targets import all_targets
    return all_targets()[cell.settings.target].device


def _warm_for(warm_start: bool | Literal["auto"], device: str) -> bool:
    """Whether a cell on ``device`` forks from a warm worker. "auto" (the default): the
    cells that use no GPU, which skip the imports a fresh process repeats; a warm worker
    with cuda cells must try each import in a throwaway fork first
    (exporter/forking/preload.py), slower than fresh cells, so cuda cells start fresh
    unless asked."""
    return warm_start is True or (warm_start == "auto" and device != "cuda")


def _warm_modules(matrix: Matrix) -> tuple[str, ...] | None:
    """What a warm worker imports for this matrix's cells: what every build imports,
    transformers where a model may use it, and the compilers of the targets whose cells
    fork (None: no cell forks, see _warm_for)."""
    from targets import all_targets
    known = all_targets()
    cells = [cell for cell in matrix.cells if _warm_for(matrix.warm_start, _device(cell))]
    targets = dict.fromkeys(cell.settings.target for cell in cells)
    if not targets:
        return None
    hf = any(warm.may_import_transformers(cell.spec) for cell in cells)
    modules = [*warm.BASE_MODULES, *(warm.HF_MODULES if hf else ()),
               *(m for t in targets for m in known[t].packaging.build_modules)]
    return tuple(dict.fromkeys(modules))


def _link_file(source: Path, link: Path) -> None:
    """The cell's artifact under a readable name: a hard link into the cache (a copy
    where the cache is on another file system)."""
    link.unlink(missing_ok=True)
    try:
        os.link(source, link)
    except OSError:
        shutil.copyfile(source, link)

