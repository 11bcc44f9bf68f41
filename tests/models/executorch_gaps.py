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


class TokenMixer(torch.nn.Module):
    """An embedding table, a linear 32 divides (64 in) and one it does not (40 in):
    --quantize int4-weight quantizes the first in groups of 32 and says why the second
    stays float; the table becomes int8 rows."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(50, 64)
        self.wide = torch.nn.Linear(64, 40)
        self.narrow = torch.nn.Linear(40, 16)

    def forward(self, ids):
        return self.narrow(torch.relu(self.wide(self.table(ids))))


def token_mixer():
    torch.manual_seed(0)
    return (TokenMixer().eval(), (torch.randint(0, 50, (2, 6)),),
            ({0: Dim("batch", min=1, max=8)},))
