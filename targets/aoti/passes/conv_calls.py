"""Reading a 2-D convolution node's arguments, whichever of torch's two spellings the graph
holds (``aten.conv2d`` with defaults left out, or ``aten.convolution`` with every one)."""

from __future__ import annotations

from typing import NamedTuple

import torch

_CONV2D = torch.ops.aten.conv2d.default
_CONVOLUTION = torch.ops.aten.convolution.default
_CONV2D_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")


class Conv2dCall(NamedTuple):
    x: object
    weight: object
    bias: object
    stride: list
    padding: object  # a list, or "same"/"valid" for conv2d's string form
    dilation: list
    groups: int


def conv2d_call(node: torch.fx.Node) -> Conv2dCall | None:
    """A non-transposed 2-D convolution's arguments, or None for any other node."""
    if node.op != "call_function" or node.target not in (_CONV2D, _CONVOLUTION):
        return None
    if node.target is _CONVOLUTION:
        x, weight, bias, stride, padding, dilation, transposed, _, groups = node.args
        return None if transposed else Conv2dCall(x, weight, bias, stride, padding,
                                                  dilation, groups)
    given = {**dict(zip(_CONV2D_ARGS, node.args)), **node.kwargs}
    return Conv2dCall(given["input"], given["weight"], given.get("bias"),
                      given.get("stride", [1]), given.get("padding", [0]),
                      given.get("dilation", [1]), given.get("groups", 1))


def pair(value) -> list:
    """A stride/padding/dilation as [height, width]."""
    value = list(value) if isinstance(value, (list, tuple)) else [value]
    return value * 2 if len(value) == 1 else value
