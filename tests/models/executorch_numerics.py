"""Small models whose ops XNNPACK (ExecuTorch 1.5.1) would compute otherwise than torch:
each stands for the coverage-suite architectures that failed validation on executorch
(targets/executorch/xnnpack_guards.py)."""

import torch


class TanhGeluMlp(torch.nn.Module):
    """The MLP of GPT-BigCode, StarCoder2 and Gemma: gelu(approximate='tanh')."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x), approximate="tanh"))


def tanh_gelu_mlp():
    torch.manual_seed(0)
    return TanhGeluMlp().eval(), (3 * torch.randn(4, 16),)


class PermutedBias(torch.nn.Module):
    """DeBERTa's query bias as remove_noops folds it: a stored (1, 2, 1, 16) tensor that
    is contiguous under strides (32, 16, 32, 1), not the default (32, 16, 16, 1)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.randn(1, 1, 2, 16).permute(0, 2, 1, 3))

    def forward(self, x):
        return torch.relu(x) + self.bias


def permuted_bias():
    torch.manual_seed(0)
    return PermutedBias().eval(), (torch.randn(1, 2, 16, 16),)
