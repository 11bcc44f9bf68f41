"""A model whose custom op crashes the process that runs the artifact (the validation
subprocess, ``python -m runtime run-cases``) with SIGSEGV, and works in eager PyTorch."""

import os
import signal
import sys

import torch


@torch.library.custom_op("edgetest::crash_in_runtime", mutates_args=())
def crash_in_runtime(x: torch.Tensor) -> torch.Tensor:
    if "run-cases" in sys.argv:
        os.kill(os.getpid(), signal.SIGSEGV)
    return x * 2


@crash_in_runtime.register_fake
def _(x):
    return torch.empty_like(x)


class Crashes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return crash_in_runtime(self.linear(x))


def factory():
    torch.manual_seed(0)
    return Crashes().eval(), (torch.randn(2, 8),), None
