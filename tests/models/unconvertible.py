"""Custom ops in the middle of a model, for placement and lowering tests (tests/plan/,
tests/exporter/builder/): ``mid_clip`` for one op a backend claims and then fails to
convert (a test claims it for the target), ``mix`` for a fallback op that reads two
values, one of them from the target's side."""

import torch
from torch.export import Dim


@torch.library.custom_op("edgetest::mid_clip", mutates_args=())
def mid_clip(x: torch.Tensor) -> torch.Tensor:
    return 2.0 * torch.tanh(x / 2.0)


@mid_clip.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("edgetest::mix", mutates_args=())
def mix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * torch.sigmoid(b)


@mix.register_fake
def _(a, b):
    return torch.empty_like(a)


class MiddleOp(torch.nn.Module):
    """linear, relu, mid_clip, linear, relu, linear: the custom op in the middle."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(16, 32)
        self.mid = torch.nn.Linear(32, 32)
        self.out = torch.nn.Linear(32, 8)

    def forward(self, x):
        hidden = mid_clip(torch.relu(self.inp(x)))
        return self.out(torch.relu(self.mid(hidden)))


def factory():
    torch.manual_seed(0)
    return MiddleOp().eval(), (torch.randn(2, 16),), ({0: Dim("batch", min=1, max=16)},)


class Interleaved(torch.nn.Module):
    """Two fallback regions around one target region: ``mix`` reads the target's
    ``a`` and the fallback's ``b``, and the target's ``d`` reads ``b`` too (a fallback
    group {b, mix} would feed the target's group and read from it)."""

    def forward(self, x):
        a = torch.relu(x)
        b = mid_clip(x)
        return mix(a, b), b * a


def interleaved_factory():
    return Interleaved().eval(), (torch.randn(2, 16),), None


class MostlyCustom(torch.nn.Module):
    """Four custom ops and one linear: most of it cannot leave the CPU fallback."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(16, 16)

    def forward(self, x):
        return mid_clip(mix(mid_clip(self.inp(x)), mid_clip(x)))


def mostly_custom_factory():
    torch.manual_seed(0)
    return MostlyCustom().eval(), (torch.randn(2, 16),), None
