"""The pattern GPT-2 used for position ids: a cumsum over a bool mask. PyTorch gives
int64; TVM's importer (0.2x) types the result bool, and its LLVM codegen fails on it."""

import torch


class PositionsFromMask(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 16)
        self.proj = torch.nn.Linear(16, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.cumsum(ids != 0, dim=-1)
        return self.proj(self.embed(positions) + self.embed(ids))


def factory():
    torch.manual_seed(0)
    return PositionsFromMask().eval(), (torch.randint(0, 64, (2, 12)),)
