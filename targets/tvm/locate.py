"""Where a TVM failure comes from, and TVM's native logging: used by target.py and
compile.py alike (kept apart so neither imports the other back)."""

from __future__ import annotations

import logging
import re

from torch.export import ExportedProgram
from torch.fx import Node


def native_stderr_to_log(logger: logging.Logger):
    """TVM's C++ logging (``Warning: Scope Saving``, ``Fast mode segfaults when...``, a
    dozen lines per partition) writes to file descriptor 2, past Python's logging. Send it
    to the debug log instead (``--verbose`` shows it); errors still arrive as exceptions."""
    from runtime.host.stderr_filter import native_stderr

    def to_log(lines: list[str]) -> None:
        for line in lines:
            logger.debug("tvm: %s", line.rstrip("\n"))
    return native_stderr(to_log)


def ops_named_in(text: str, program: ExportedProgram) -> list[Node]:
    """Graph nodes whose op TVM's importer names in an error: 'Unsupported function
    types ['cumsum.default']'."""
    nodes = [n for n in program.graph.nodes if n.op == "call_function"]
    quoted = set(re.findall(r"'([\w.]+)'", text))
    hits = [n for n in nodes if getattr(n.target, "__name__", None) in quoted]
    if hits:
        return hits
    words = {re.sub(r"\d+$", "", w) for w in re.findall(r"[A-Za-z_][A-Za-z_0-9]*", text)}
    return [n for n in nodes if _op_stem(n) in words]


def _op_stem(node: Node) -> str:
    return getattr(node.target, "__name__", "").split(".")[0]
