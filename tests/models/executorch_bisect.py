"""Small models that ExecuTorch computes wrongly once one of our workarounds is switched off
(tests/targets/executorch/test_executorch_bisect.py): the bisect must name the op."""

import torch


class TanhGeluBlock(torch.nn.Module):
    """linear -> gelu(approximate='tanh') -> linear, all XNNPACK's: its GELU ignores the
    approximation (targets/executorch/xnnpack_guards.py)."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 64)
        self.down = torch.nn.Linear(64, 8)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x), approximate="tanh"))


def tanh_gelu_block():
    torch.manual_seed(0)
    return TanhGeluBlock().eval(), (2 * torch.randn(4, 16),)


class SlotIndex(torch.nn.Module):
    """A float branch for XNNPACK beside an integer remainder on ExecuTorch's portable
    kernel, which takes the dividend's sign (targets/executorch/floor_remainder.py)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x, positions):
        slots = (positions - 5).remainder(8)
        return torch.relu(self.proj(x)), slots * 2


def slot_index():
    torch.manual_seed(0)
    return SlotIndex().eval(), (torch.randn(2, 8), torch.arange(8).reshape(1, 8))
