"""Capture a finiteness guard as its repair branch.

Models guard fp16 overflow with a data-dependent ``if`` (transformers' BART, T5, LongT5,
Pix2Struct...)::

    if hidden.dtype == torch.float16 and torch.isinf(hidden).any():   # or
    if not torch.isfinite(hidden).all():
        hidden = torch.clamp(hidden, -clamp, clamp)

torch.export cannot branch on tensor data. The branch is a repair that leaves finite
values as they are (up to its clamp bound), so the graph takes it unconditionally:

    before: isinf(h).any() -> item -> if ... (GuardOnDataDependentSymNode)
    after:  clamp(h, -clamp, clamp)

While tracing, ``bool()`` (and ``.item()``) of a boolean scalar that the traced graph
computes as "is any element inf or NaN" (``any`` of isinf/isnan, ``all`` of isfinite,
their negations and or/and of such) answers as if one were: the repair runs. Anything
else goes to torch as before.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Iterator

import torch
from torch.fx import Node
from torch.fx.experimental import proxy_tensor

log = logging.getLogger(__name__)

# ATen op names (every overload): what the spellings of the guard trace to
_FLAGS_NONFINITE = {"isinf", "isnan"}  # True marks a bad element
_FLAGS_FINITE = {"isfinite"}  # True marks a good element
_NOT = {"logical_not", "bitwise_not"}
_OR = {"logical_or", "bitwise_or", "__or__"}
_AND = {"logical_and", "bitwise_and", "__and__"}
_ANY, _ALL = {"any"}, {"all"}


@contextlib.contextmanager
def repair_finiteness_guards() -> Iterator[list[str]]:
    """During torch.export: finiteness guards take their repair branch. Yields the list
    of source lines ("file:line") whose guard was answered, filled as capture runs."""
    taken: list[str] = []
    original_bool, original_item = torch.Tensor.__bool__, torch.Tensor.item

    def guarded_bool(self: torch.Tensor) -> bool:
        answer = _assumed(self)
        if answer is None:
            return original_bool(self)
        taken.append(_caller())
        return answer

    def guarded_item(self: torch.Tensor):
        answer = _assumed(self) if self.dtype == torch.bool else None
        if answer is None:
            return original_item(self)
        taken.append(_caller())
        return answer

    torch.Tensor.__bool__, torch.Tensor.item = guarded_bool, guarded_item
    try:
        yield taken
    finally:
        torch.Tensor.__bool__, torch.Tensor.item = original_bool, original_item
    if taken:
        lines = sorted(set(taken))
        log.info("captured %d finiteness guard(s) as their repair branch (a no-op where "
                 "every value is finite): %s", len(lines), ", ".join(lines))


def _assumed(tensor: torch.Tensor) -> bool | None:
    """The guard's value if the tensor held an inf or a NaN, where ``tensor`` is such a
    guard being traced; None otherwise (not tracing, or another condition)."""
    if tensor.dim() != 0:  # a plain int: asking numel() of a dynamic shape would guard it
        return None
    node = _traced_node(tensor)
    return None if node is None else _scalar(node)


def _traced_node(tensor: torch.Tensor) -> Node | None:
    mode = proxy_tensor.get_proxy_mode()
    if mode is None:
        return None
    if type(tensor).__name__ == "FunctionalTensor":  # the traced value is the one inside
        tensor = torch._from_functional_tensor(tensor.elem)
    slot = proxy_tensor.get_proxy_slot(tensor, mode.tracer, None)
    proxy = getattr(slot, "proxy", None)
    return getattr(proxy, "node", None)


def _scalar(node: Node) -> bool | None:
    """A boolean scalar's value under "some element is inf and some is NaN"."""
    target, args = _name(node), node.args
    if target in _ANY:
        return True if _elementwise(args[0]) == "nonfinite" else None
    if target in _ALL:
        return False if _elementwise(args[0]) == "finite" else None
    if target in _NOT:
        inner = _scalar(args[0]) if isinstance(args[0], Node) else None
        return None if inner is None else not inner
    if target in _OR | _AND and all(isinstance(a, Node) for a in args[:2]):
        left, right = _scalar(args[0]), _scalar(args[1])
        if left is None or right is None:
            return None
        return (left or right) if target in _OR else (left and right)
    return None


def _elementwise(node) -> str | None:
    """What True marks in a boolean mask: "nonfinite", "finite", or None (anything else)."""
    if not isinstance(node, Node):
        return None
    name = _name(node)
    if name in _FLAGS_NONFINITE:
        return "nonfinite"
    if name in _FLAGS_FINITE:
        return "finite"
    if name in _NOT:
        inner = _elementwise(node.args[0])
        return {"nonfinite": "finite", "finite": "nonfinite"}.get(inner)
    if name in _OR | _AND:
        kinds = {_elementwise(a) for a in node.args[:2]}
        wanted = "nonfinite" if name in _OR else "finite"
        return wanted if kinds == {wanted} else None
    return None


def _name(node: Node) -> str | None:
    packet = getattr(node.target, "overloadpacket", None)  # aten.any.dim -> "any"
    return getattr(packet, "__name__", None) if node.op == "call_function" else None


def _caller() -> str:
    # the model's line: the frame that called bool() or .item(), past this module's
    frame = sys._getframe(2)
    return f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"
