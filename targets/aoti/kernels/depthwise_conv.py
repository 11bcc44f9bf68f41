"""``edge_exporter::depthwise_conv2d``: a depthwise convolution (one filter per channel)
as one Triton kernel of ours (depthwise_triton.py), which the cuda target places where
it timed faster than cuDNN's (passes/depthwise_kernel.py). The block sizes are the op's
arguments: the pass times a few and gives the fastest.

As ops.py's ops: a ``torch.library.triton_op`` where Triton is installed (AOTInductor
compiles its kernel into the library), else a plain custom op over torch's convolution,
so graphs holding it can be captured and checked on a CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from targets.aoti.kernels.ops import NAMESPACE, TRITON

DEPTHWISE_CONV2D = f"{NAMESPACE}::depthwise_conv2d"


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              stride: list[int], padding: list[int], dilation: list[int], block_p: int,
              block_c: int, warps: int) -> torch.Tensor:
    """The op's math: torch's grouped convolution, one group a channel."""
    return F.conv2d(x, weight, bias, stride, padding, dilation, groups=x.shape[1])


def _kernel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            stride: list[int], padding: list[int], dilation: list[int], block_p: int,
            block_c: int, warps: int) -> torch.Tensor:
    from targets.aoti.kernels.depthwise_triton import launch_depthwise_conv
    return launch_depthwise_conv(x, weight, bias, stride, padding, dilation, block_p,
                                 block_c, warps)


def _define() -> None:
    if TRITON:
        op = torch.library.triton_op(DEPTHWISE_CONV2D, _kernel, mutates_args=())
        op.register_kernel("cpu", reference)
        return
    op = torch.library.custom_op(DEPTHWISE_CONV2D, mutates_args=(),
                                 schema=torch.library.infer_schema(_kernel,
                                                                   mutates_args=()))(reference)
    op.register_fake(_fake)


def _fake(x, weight, bias, stride, padding, dilation, block_p, block_c, warps):
    kh, kw = weight.shape[2:]
    sizes = [(size + 2 * p - d * (k - 1) - 1) // s + 1 for size, p, d, k, s in
             zip(x.shape[2:], padding, dilation, (kh, kw), stride)]
    return x.new_empty((x.shape[0], x.shape[1], *sizes))


_define()
depthwise_conv2d = torch.ops.edge_exporter.depthwise_conv2d.default
