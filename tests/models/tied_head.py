"""A token embedding whose transposed weight is the output head (tied, as zoo:decoder's
head is): ``tokens.weight.T`` is a value computed from weights alone."""

import torch


class TiedHead(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(64, 16)
        self.ln = torch.nn.LayerNorm(16)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.ln(self.tokens(input_ids)) @ self.tokens.weight.T


def factory():
    torch.manual_seed(0)
    return TiedHead().eval(), (torch.randint(0, 64, (2, 8)),)
