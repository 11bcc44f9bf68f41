"""The ATen graph a CPU-fallback partition stores (``program.json``, torch's export JSON),
as the report's node rows, read as plain JSON: no weights loaded, nothing deserialized
into torch objects, so a report never runs the artifact's code."""

from __future__ import annotations

import json
import re
from typing import Any

from torch._export.serde.schema import ScalarType


def graph_nodes(program_json: bytes, limit: int) -> list[dict]:
    """Rows ``{name, op, inputs, outputs, origin}`` as ``Target.graph_nodes`` gives them,
    at most ``limit``; tensors typed from the graph's ``tensor_values`` (a dynamic dim
    shown by its symbol)."""
    graph_module = json.loads(program_json)["graph_module"]
    graph = graph_module["graph"]
    values = graph.get("tensor_values") or {}
    weights = _weight_names(graph_module.get("signature") or {})
    rows = []
    for node in graph.get("nodes", [])[:limit]:
        inputs = [name for arg in node.get("inputs", []) for name in _tensor_names(arg.get("arg"))]
        outputs = [name for out in node.get("outputs", []) for name in _tensor_names(out)]
        target = str(node.get("target", "")).removeprefix("torch.ops.")
        rows.append({"name": outputs[0] if outputs else target, "op": target, "origin": "",
                     "inputs": [_tensor(n, values, n in weights) for n in inputs],
                     "outputs": [_tensor(n, values, False) for n in outputs]})
    return rows


def _tensor_names(arg: Any) -> list[str]:
    if not isinstance(arg, dict):
        return []
    if isinstance(arg.get("as_tensor"), dict):
        return [arg["as_tensor"].get("name", "")]
    if isinstance(arg.get("as_tensors"), list):
        return [t.get("name", "") for t in arg["as_tensors"] if isinstance(t, dict)]
    return []


def _weight_names(signature: dict) -> set[str]:
    names = set()
    for spec in signature.get("input_specs", []):
        for kind in ("parameter", "buffer", "tensor_constant"):
            arg = (spec.get(kind) or {}).get("arg") or {}
            if "name" in arg:
                names.add(arg["name"])
    return names


def _tensor(name: str, values: dict, weight: bool) -> dict:
    value = values.get(name)
    if not isinstance(value, dict):
        return {"name": name, "type": "", "weight": weight}
    try:
        dtype = ScalarType(value.get("dtype")).name.lower()
    except ValueError:
        dtype = "?"
    dims = [_dim(size) for size in value.get("sizes", []) if isinstance(size, dict)]
    return {"name": name, "type": f"{dtype}[{', '.join(dims)}]", "weight": weight}


def _dim(size: dict) -> str:
    """``{"as_int": 16}`` -> "16"; ``{"as_expr": {"expr_str": "2*Symbol('s47', ...)"}}`` -> "2*s47"."""
    if "as_int" in size:
        return str(size["as_int"])
    expr = str((size.get("as_expr") or {}).get("expr_str", "?"))
    return _SYMBOL.sub(r"\1", expr)


_SYMBOL = re.compile(r"Symbol\('(\w+)'[^)]*\)")
