"""Models with ATen ops ExecuTorch 1.5 has neither an XNNPACK config nor a kernel for
(``special_i0``, ``logcumsumexp``): they must run on the CPU fallback around the
ExecuTorch partitions."""

import torch
from torch.export import Dim


class BesselNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(16, 32)
        self.out = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.out(torch.special.i0(torch.tanh(self.inp(x))))


class TwoGaps(BesselNet):
    def forward(self, x):
        hidden = torch.special.i0(torch.tanh(self.inp(x)))
        return self.out(torch.logcumsumexp(hidden, 1))


def _inputs():
    return (torch.randn(2, 16),), ({0: Dim("batch", min=1, max=16)},)


def factory():
    torch.manual_seed(0)
    return (BesselNet().eval(), *_inputs())


def two_factory():
    torch.manual_seed(0)
    return (TwoGaps().eval(), *_inputs())
