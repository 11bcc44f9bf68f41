"""How a model's flat outputs nest, encoded as plain JSON.

torch's own ``treespec_dumps`` names every container type (e.g. a Hugging Face
``ModelOutput`` class), so reading it back would need that class importable on
the device. We keep only what a caller needs to index the result: tuples, lists
and dicts. Mapping-like containers (dicts, namedtuples, ``ModelOutput``) become
dicts with their keys; any other container becomes a tuple.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # encode_tree runs in the exporter; decode_tree on devices without torch
    from torch.utils._pytree import TreeSpec


def encode_tree(spec: TreeSpec) -> Any:
    counter = itertools.count()

    def encode(node: TreeSpec) -> Any:
        if node.is_leaf():
            return {"leaf": next(counter)}
        # torch 2.13 has children(); 2.11 only children_specs.
        children = node.children() if hasattr(node, "children") else node.children_specs
        items = [encode(child) for child in children]
        keys = _mapping_keys(node)
        if keys is not None:
            return {"kind": "dict", "keys": keys, "items": items}
        kind = "list" if node.type is list else "tuple"
        return {"kind": kind, "items": items}

    return encode(spec)


def _mapping_keys(node: TreeSpec) -> list[str] | None:
    fields = getattr(node.type, "_fields", None)  # namedtuple
    if fields is not None:
        return [str(f) for f in fields]
    context = node.context
    if isinstance(context, (list, tuple)) and all(isinstance(k, str) for k in context) and context:
        return list(context)  # dict and ModelOutput keep their keys as context
    return None


def decode_tree(tree: Any, flat: Sequence[Any]) -> Any:
    """Rebuild the nested structure from ``flat`` (in the same order as flattening)."""
    if tree is None:  # no tree recorded: a single output stays bare, several become a tuple
        return flat[0] if len(flat) == 1 else tuple(flat)
    if "leaf" in tree:
        return flat[tree["leaf"]]
    items = [decode_tree(child, flat) for child in tree["items"]]
    if tree["kind"] == "dict":
        return dict(zip(tree["keys"], items))
    return list(items) if tree["kind"] == "list" else tuple(items)
