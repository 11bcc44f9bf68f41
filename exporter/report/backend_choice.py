"""One line per partition whose target chose its backend at build time (the manifest's
``build.backend_choice``, targets/aoti/choice.py): what it kept and why, and each
candidate's median call or why it was dropped. Read from a manifest that may be hostile:
anything not of the expected shape is left out, never raised."""

from __future__ import annotations


def choice_lines(build: object) -> list[str]:
    chosen = build.get("backend_choice") if isinstance(build, dict) else None
    if not isinstance(chosen, dict):
        return []
    return [_line(str(name), record) for name, record in chosen.items()
            if isinstance(record, dict)]


def _line(partition: str, record: dict) -> str:
    """'backend of partition p0: onnx (measured at 2 threads): onnx 121 ms, aoti 451 ms'"""
    threads = record.get("threads")
    how = str(record.get("by") or "not said") + (
        f" at {threads} threads" if isinstance(threads, int) else "")
    candidates = record.get("candidates")
    # the kept one first: the manifest on disk has its keys sorted, the build's record not
    rows = sorted(candidates.items() if isinstance(candidates, dict) else (),
                  key=lambda row: row[0] != record.get("chosen"))
    figures = [_figure(str(name), c) for name, c in rows if isinstance(c, dict)]
    figures = [f for f in figures if f]
    return (f"backend of partition {partition}: {record.get('chosen')} ({how})"
            + (": " + ", ".join(figures) if figures else "") + _stalls(rows))


def _stalls(rows: list) -> str:
    """The timing rounds left out as stalled (a loaded machine; targets/aoti/timing.py):
    every timed candidate carries the same list."""
    stalled = next((c.get("stalled_rounds") for _, c in rows
                    if isinstance(c, dict) and isinstance(c.get("stalled_rounds"), list)), [])
    return f"; {len(stalled)} stalled timing round(s) left out" if stalled else ""


def _figure(name: str, candidate: dict) -> str | None:
    median = candidate.get("median_ms")
    if isinstance(median, (int, float)) and not isinstance(median, bool):
        return f"{name} {median:.4g} ms"
    if candidate.get("dropped"):
        return f"{name} dropped ({candidate['dropped']})"
    return None
