"""What kind of op a graph node calls: the one test for "custom op" that placement, the
targets' support tables and the build's preload all use."""

from __future__ import annotations

CORE_NAMESPACES = ("aten", "prims")


def is_custom_op(op: object) -> bool:
    """An operator registered outside ATen and prims (``torch.library``, a vendor's ops).
    Python functions (``operator.getitem``, SymInt arithmetic) have no namespace: not ops."""
    namespace = getattr(op, "namespace", None)
    return namespace is not None and namespace not in CORE_NAMESPACES


def op_label(op: object) -> str:
    """How reports and errors name what a node calls: an operator by its qualified name
    (``aten.add.Tensor``), a Python function by its module and name (``operator.getitem``),
    never its repr (``<built-in function getitem>``)."""
    if hasattr(op, "namespace") or isinstance(op, str):
        return str(op)
    name = getattr(op, "__qualname__", None) or getattr(op, "__name__", None)
    if name is None:
        return str(op)
    module = getattr(op, "__module__", None) or ""
    module = "operator" if module == "_operator" else module
    return f"{module}.{name}" if module and module != "builtins" else name
