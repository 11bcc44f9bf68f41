"""What kind of op a graph node calls: the one test for "custom op" that placement, the
targets' support tables and the build's preload all use."""

from __future__ import annotations

CORE_NAMESPACES = ("aten", "prims")


def is_custom_op(op: object) -> bool:
    """An operator registered outside ATen and prims (``torch.library``, a vendor's ops).
    Python functions (``operator.getitem``, SymInt arithmetic) have no namespace: not ops."""
    namespace = getattr(op, "namespace", None)
    return namespace is not None and namespace not in CORE_NAMESPACES
