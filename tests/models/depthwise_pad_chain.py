"""MobileNetV1's first depthwise step, cut to six ops: a 1x1 convolution, batch norm and
ReLU6, an asymmetric pad (TensorFlow's "same"), then a 3x3 stride-2 depthwise
convolution, batch norm and ReLU6. The tvm target's artifact of it read 6.0 or 1e34
where eager has 0-0.17 (the pad's border, targets/tvm/tiling.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DepthwisePadChain(nn.Module):
    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.pointwise = nn.Conv2d(8, channels, 1, bias=False)
        self.norm1 = nn.BatchNorm2d(channels)
        self.depthwise = nn.Conv2d(channels, channels, 3, stride=2, groups=channels,
                                   bias=False)
        self.norm2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = F.hardtanh(self.norm1(self.pointwise(x)), 0.0, 6.0)
        y = F.pad(y, (0, 1, 0, 1))
        return F.hardtanh(self.norm2(self.depthwise(y)), 0.0, 6.0)


def factory():
    torch.manual_seed(0)
    model = DepthwisePadChain().eval()
    with torch.no_grad():  # outputs of unit order, as a trained model's
        model.pointwise.weight.mul_(3)
        model.depthwise.weight.mul_(3)
    return model, (torch.randn(1, 8, 16, 16, generator=torch.Generator().manual_seed(1)),)
