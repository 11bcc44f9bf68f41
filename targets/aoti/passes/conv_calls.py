"""Reading a 2-D convolution node's arguments, whichever of torch's two spellings the graph
holds (``aten.conv2d`` with defaults left out, or ``aten.convolution`` with every one);
what the cuda target's convolution rewrites share: the static, constant-weight case they
rewrite and an input's windows as a view."""

from __future__ import annotations

from typing import NamedTuple

import torch

from passes.graph.rewrite import attribute

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


class StaticConv(NamedTuple):
    call: Conv2dCall
    value: torch.Tensor  # the input's example value: 4-D, static sizes
    weight: torch.Tensor  # the constant 4-D weight


def static_conv(module: torch.fx.GraphModule, node: torch.fx.Node,
                dtypes: tuple) -> StaticConv | None:
    """``node`` as a 2-D convolution of a static 4-D input by a constant weight of one of
    ``dtypes`` with a constant bias or none, and numeric padding; else None."""
    call = conv2d_call(node)
    if call is None:
        return None
    value = call.x.meta.get("val") if isinstance(call.x, torch.fx.Node) else None
    weight = attribute(module, call.weight)
    if value is None or value.dim() != 4 or weight is None or weight.dim() != 4:
        return None
    if isinstance(call.padding, str) or not all(isinstance(d, int) for d in value.shape):
        return None
    if type(weight) not in (torch.Tensor, torch.nn.Parameter) or weight.dtype not in dtypes:
        return None
    if call.bias is not None and attribute(module, call.bias) is None:
        return None
    return StaticConv(call, value, weight)


def static_dense(module: torch.fx.GraphModule, node: torch.fx.Node) -> StaticConv | None:
    """``node`` as a static half-precision convolution of one group (filters of the
    input's dtype) with an output, else None."""
    conv = static_conv(module, node, (torch.float16, torch.bfloat16))
    if conv is None or conv.call.groups != 1 or conv.weight.dtype != conv.value.dtype:
        return None
    return conv if min(output_size(conv)) >= 1 else None


def static_depthwise(module: torch.fx.GraphModule, node: torch.fx.Node) -> StaticConv | None:
    """``node`` as a static half-precision depthwise convolution (one filter a channel, of
    the input's dtype) with an output, else None."""
    conv = static_conv(module, node, (torch.float16, torch.bfloat16))
    if conv is None:
        return None
    channels, w = conv.value.shape[1], conv.weight
    if conv.call.groups != channels or w.shape[0] != channels or w.shape[1] != 1:
        return None
    if w.dtype != conv.value.dtype or min(output_size(conv)) < 1:
        return None
    return conv


def output_size(conv: StaticConv) -> list[int]:
    """The convolution's output height and width."""
    call, kernel = conv.call, conv.weight.shape[2:]
    return [(size + 2 * p - d * (k - 1) - 1) // s + 1 for size, p, d, k, s in
            zip(conv.value.shape[2:], pair(call.padding), pair(call.dilation), kernel,
                pair(call.stride))]


def windows(x: torch.Tensor, kernel: tuple, stride: list, padding: list,
            dilation: list) -> torch.Tensor:
    """The padded input's windows as a view, [N, C, Ho, Wo, kh, kw]."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    padded = torch.nn.functional.pad(x, (pw, pw, ph, ph)) if ph or pw else x
    found = padded.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)
    return found[..., ::dh, ::dw] if dh > 1 or dw > 1 else found
