"""A model whose custom op crashes the process that runs the artifact (the validation
subprocess, ``python -m runtime run-cases``) with SIGSEGV, and works in eager PyTorch;
``exits_factory``'s op prints a line there and exits with status 1."""

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


@torch.library.custom_op("edgetest::exit_in_runtime", mutates_args=())
def exit_in_runtime(x: torch.Tensor) -> torch.Tensor:
    # as a library that gives up on a device error: a line on stderr, then exit(1)
    if "run-cases" in sys.argv:
        print("edgetest: device lost while running exit_in_runtime", file=sys.stderr, flush=True)
        os._exit(1)
    return x * 2


@exit_in_runtime.register_fake
def _(x):
    return torch.empty_like(x)


class Exits(Crashes):
    def forward(self, x):
        return exit_in_runtime(self.linear(x))


def exits_factory():
    """The validation process prints one line and exits with status 1 in the first run."""
    torch.manual_seed(0)
    return Exits().eval(), (torch.randn(2, 8),), None
