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


class CeilModePooledCnn(torch.nn.Module):
    """EfficientNet's head as Hugging Face writes it: AvgPool2d(1280, ceil_mode=True) on a
    small map, one window wider than the input (XNNPACK refuses ceil_mode pooling)."""

    def __init__(self, channels: int = 16):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.pool = torch.nn.AvgPool2d(channels * 8, ceil_mode=True)
        self.head = torch.nn.Linear(channels, 4)

    def forward(self, x):
        pooled = self.pool(torch.nn.functional.silu(self.conv(x)))
        return self.head(pooled.flatten(1))


def ceil_mode_pooled_cnn():
    torch.manual_seed(0)
    return CeilModePooledCnn().eval(), (torch.randn(1, 3, 7, 7),)
