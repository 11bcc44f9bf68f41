"""Where a graph node came from in the user's code: the line the build's tables, the
bisect and the errors name."""

from __future__ import annotations

import re

from torch.fx import Node

from exporter.model.export_errors import is_model_code


def source_line(node: Node) -> str | None:
    """The innermost frame of the node's stack trace in the model's own code (the line
    calling ``self.linear(x)``, not torch's linear.py), else the innermost frame."""
    trace = node.meta.get("stack_trace") or ""
    matches = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', trace)
    if not matches:
        return None
    path, line, func = ([m for m in matches if is_model_code(m[0])] or matches)[-1]
    return f"{path}:{line} in {func}"
