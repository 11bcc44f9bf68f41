"""The executorch target's card (targets/card.py): its recipes, and whether ExecuTorch is
here, without importing torch or executorch."""

from __future__ import annotations

import importlib.metadata

from targets.card import TargetCard, install_command, installed
from targets.executorch import describe


def executorch_here() -> tuple[bool, str]:
    if not installed("executorch"):
        return False, f"executorch is not installed; {install_command('executorch')}"
    return True, f"executorch {importlib.metadata.version('executorch')}"


EXECUTORCH = TargetCard(
    "executorch", "cpu", "executorch", "ExecuTorch .pte program per partition: XNNPACK "
    "delegate plus ExecuTorch's portable kernels",
    recipes=("int8-static", "int8-dynamic", "int4-weight"),  # targets/executorch/quantize.py
    check=executorch_here, placement_lines=describe.placement_lines,
    memory_lines=describe.memory_lines)
