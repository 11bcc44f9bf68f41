"""A model with a custom op that no backend knows: a ``torch.library.custom_op`` with a
CPU kernel (and a fake kernel so torch.export can trace it)."""

import torch
from torch.export import Dim


@torch.library.custom_op("edgetest::soft_clip", mutates_args=())
def soft_clip(x: torch.Tensor, limit: float) -> torch.Tensor:
    return limit * torch.tanh(x / limit)


@soft_clip.register_fake
def _(x, limit):
    return torch.empty_like(x)


class SoftClipNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(16, 32)
        self.out = torch.nn.Linear(32, 8)

    def forward(self, x):
        hidden = torch.relu(self.inp(x))
        return self.out(soft_clip(hidden, 2.0))


def factory():
    torch.manual_seed(0)
    return SoftClipNet().eval(), (torch.randn(2, 16),), ({0: Dim("batch", min=1, max=16)},)


class SoftClipHead(torch.nn.Module):
    """The custom op last: one delegated island before it (one compile per target)."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(16, 32)

    def forward(self, x):
        return soft_clip(torch.relu(self.inp(x)), 2.0)


def head_factory():
    torch.manual_seed(0)
    return SoftClipHead().eval(), (torch.randn(2, 16),), ({0: Dim("batch", min=1, max=16)},)


class SoftClipTwice(SoftClipHead):
    """Two custom-op nodes: `--fallback forbid` must name both, not the first it meets."""

    def forward(self, x):
        return soft_clip(torch.relu(soft_clip(self.inp(x), 2.0)), 1.0)


def twice_factory():
    torch.manual_seed(0)
    return SoftClipTwice().eval(), (torch.randn(2, 16),), ({0: Dim("batch", min=1, max=16)},)
