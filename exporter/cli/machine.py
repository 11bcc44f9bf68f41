"""Commands about this machine and its keys: doctor, targets, keygen."""

from __future__ import annotations

from pathlib import Path

import typer

from exporter.cli.common import (DEBUG, JSON, QUIET, VERBOSE, app, guarded, print_json, result,
                                 wrote)


@app.command()
def doctor(as_json: bool = JSON, quiet: bool = QUIET, verbose: bool = VERBOSE,
           debug: bool = DEBUG) -> None:
    """What this machine can build and run, and the fix for each problem."""
    def action() -> int:
        from exporter.doctor import PROBLEM, as_json as doctor_json, run_checks

        checks = run_checks()
        if as_json:
            print_json(doctor_json(checks))
            return 0
        from rich.table import Table
        from rich.text import Text
        table = Table(show_edge=False)
        for column in ("check", "status", "found", "fix"):
            table.add_column(column, overflow="fold")  # a long word breaks, never "…"
        colour = {"ok": "green", "problem": "red", "absent": "yellow"}
        for check in checks:  # Text, not markup: output goes out with markup off
            table.add_row(check.name, Text(check.status, style=colour[check.status]),
                          check.found, check.fix)
        result(table)
        problems = sum(c.status == PROBLEM for c in checks)
        result(f"{problems} problem(s)" if problems else "no problems found")
        return 0
    guarded(action, quiet=quiet, verbose=verbose, debug=debug, as_json=as_json,
            uses_torch=False)


@app.command()
def targets(as_json: bool = JSON, quiet: bool = QUIET, verbose: bool = VERBOSE,
            debug: bool = DEBUG) -> None:
    """List targets and whether each can build and run on this machine."""
    def action() -> int:
        from targets.registry import described

        rows = []
        for card in described().values():
            ok, reason = card.check()
            rows.append({"name": card.name, "device": card.device, "backend": card.backend,
                         "available": ok, "reason": reason, "description": card.description,
                         "quantize": list(card.recipes)})
        if as_json:
            print_json({"targets": rows})
            return 0
        from rich.table import Table
        from rich.text import Text
        table = Table(show_edge=False)
        for column in ("target", "device", "backend", "here", "why", "--quantize"):
            table.add_column(column, overflow="fold")  # a long word breaks, never "…"
        for row in rows:
            here = Text("yes", style="green") if row["available"] else Text("no", style="red")
            table.add_row(row["name"], row["device"], row["backend"], here, row["reason"],
                          ", ".join(row["quantize"]) or "-")
        result(table)
        return 0
    guarded(action, quiet=quiet, verbose=verbose, debug=debug, as_json=as_json,
            uses_torch=False)


@app.command()
def keygen(out_dir: Path = typer.Option(..., "--out-dir", help="directory for signing.key "
                                        "(private) and signing.pub"),
           as_json: bool = JSON, quiet: bool = QUIET, verbose: bool = VERBOSE,
           debug: bool = DEBUG) -> None:
    """Make an Ed25519 key pair for `exporter sign`."""
    def action() -> int:
        from runtime.format.signing import generate_keys

        key, pub = generate_keys(out_dir)
        if as_json:
            print_json({"private_key": str(key), "public_key": str(pub)})
        else:
            wrote(key, "private: keep it secret")
            wrote(pub, "public: give it to devices")
        return 0
    guarded(action, quiet=quiet, verbose=verbose, debug=debug, as_json=as_json,
            uses_torch=False)
