"""``exporter matrix MATRIX.toml``: many builds (models x target recipes) as one table."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Optional

import typer

from exporter.cli import interrupts
from exporter.cli.common import (DEBUG, JSON, QUIET, VERBOSE, app, err_console, guarded,
                                 print_json, result, say, style, warn, wrote)


@app.command()
def matrix(
    matrix_file: Path = typer.Argument(..., metavar="MATRIX", help="MATRIX.toml: models, "
                                       "target recipes, bench settings (docs/matrix.md)"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="folder for matrix.json, "
                                       ".csv, .html, each cell's config and artifact "
                                       "(default: matrix-NAME)"),
    executor: str = typer.Option("local", "--executor", help="local: this machine, no "
                                 "server | ray: a Ray task per cell (pip install ray)"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="join this Ray "
                                              "cluster (default: start one here)"),
    workers: Optional[int] = typer.Option(None, "--workers", "-j", min=1, help="cells at a "
                                          "time (default: half the cores, at least 2; with "
                                          "--ray-address the cluster's CPUs)"),
    cache: Optional[Path] = typer.Option(None, "--cache", help="the build cache folder "
                                         "(default OUT/cache); matrices may share one"),
    rebuild: bool = typer.Option(False, "--rebuild", help="build every cell, cached or not"),
    as_json: bool = JSON, quiet: bool = QUIET, verbose: bool = VERBOSE, debug: bool = DEBUG,
) -> None:
    """Build, validate and bench models x targets; one table (json, csv, html) of the cells.

    Exit 0 when every cell passed, 1 when some failed (the table says why)."""
    def action() -> int:
        from exporter.errors import UserInputError
        from exporter.matrix.executors import EXECUTORS
        from exporter.matrix.runner import run_matrix

        if executor not in EXECUTORS:
            raise UserInputError(f"unknown --executor {executor!r}",
                                 hint=f"choose {' or '.join(EXECUTORS)}")
        if ray_address and executor != "ray":
            raise UserInputError("--ray-address needs --executor ray")
        folder = out or Path(f"matrix-{matrix_file.stem}")
        with _Display() as display:
            try:
                data = run_matrix(matrix_file, folder, executor=executor, workers=workers,
                                  ray_address=ray_address, cache=cache, rebuild=rebuild,
                                  progress=display.event)
            except KeyboardInterrupt:
                err_console.print(f"interrupted: finished cells are in the cache and the "
                                  f"table so far in {folder}/matrix.html; run the same "
                                  "command again to go on from here", highlight=False)
                interrupts.told()
                raise typer.Exit(130) from None
        _report(data, as_json)
        totals = data["totals"]
        return 0 if totals["failed"] == 0 and totals["not_run"] == 0 else 1
    guarded(action, quiet=quiet, verbose=verbose, debug=debug, as_json=as_json)


def _report(data: dict, as_json: bool) -> None:
    fresh = Counter(r["cold_because"] for r in data["cells"] if r.get("cold_because"))
    for why, count in sorted(fresh.items()):  # warm_start asked, and could not be had
        warn(f"{count} cell(s) started in a fresh interpreter, not warm: {why}")
    if as_json:
        print_json(data)
        return
    if style.quiet:
        print(data["files"]["html"])
        return
    from rich.table import Table
    from rich.text import Text

    from exporter.matrix.tables import cell_text
    table = Table(show_edge=False)
    for column in ["model", *data["columns"]]:
        table.add_column(column)
    cells = {(r["model"], r["column"]): r for r in data["cells"]}
    for model in data["models"]:
        marks = []
        for column in data["columns"]:
            verdict, details = cell_text(cells.get((model, column)))
            colour = ("green" if verdict == "ok" else "red" if verdict not in (
                "not run", "unvalidated") else "yellow")
            marks.append(Text(verdict, style=colour) + Text(
                "".join(f"\n{line}" for line in details), style="dim"))
        table.add_row(model, *marks)
    result(table)
    totals = data["totals"]
    result(f"{totals['passed']} of {totals['cells']} cells passed"
           + (f", {totals['unvalidated']} not validated (as asked)" if totals["unvalidated"]
              else "") + f"; {totals['built']} built, "
           f"{totals['cached']} from the cache, {data['wall_s']:.0f} s")
    for kind in ("html", "json", "csv"):
        wrote(data["files"][kind])


class _Display:
    """Progress on stderr: one line per finished cell, and in a terminal a status line
    (done, running, failed, elapsed, the slowest build) kept at the bottom."""

    def __init__(self) -> None:
        self.board = None
        self.live = None

    def __enter__(self) -> "_Display":
        if err_console.is_terminal and not (style.quiet or style.json):
            from rich.live import Live
            self.live = Live(console=err_console, transient=True, refresh_per_second=2,
                             get_renderable=self._status)
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()

    def event(self, kind: str, board, cell_id: str, row: dict | None) -> None:
        self.board = board
        if kind != "done":
            return
        from exporter.matrix.tables import cell_text
        verdict, details = cell_text(row)
        mark = "✓" if verdict in ("ok", "unvalidated") else "✗"
        say(f"{mark} {row['model']} / {row['column']}: {verdict}"
            + (f": {details[0]}" if details and details[0] else "")
            + f"  [{board.done}/{board.total}]")

    def _status(self):
        from rich.text import Text
        board = self.board
        if board is None:
            return Text("reading the matrix...", style="dim")
        slowest = (f" · slowest {board.slowest[0]} {board.slowest[1]:.0f}s"
                   if board.slowest else "")
        running = ", ".join(f"{c} {time.monotonic() - t:.0f}s"
                            for c, t in list(board.running.items())[:3])
        return Text(f"{board.done}/{board.total} done, {len(board.running)} running, "
                    f"{board.failed} failed · {time.monotonic() - board.started:.0f}s"
                    f"{slowest}" + (f" · now: {running}" if running else ""), style="dim")
