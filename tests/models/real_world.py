"""Small models with what real architectures do and the toolchain once failed on.

- ``stock_mha``: ``nn.MultiheadAttention(64, 4, batch_first=True)`` called with one tensor
  three times (query = key = value), as self-attention is written.
- ``stock_encoder``: ``nn.TransformerEncoder`` layers (its fast path off in eval export).
- ``bessel``: ``torch.special.i0``, which torch.onnx decomposes to ``prims.bessel_i0``
  and cannot translate: it must run on the CPU fallback, and --dry-run must say so.
- ``no_grad_rotary``: a ``@torch.no_grad()`` helper (LLaMA's rotary embedding does this;
  torch.export wraps it in a higher-order op) beside a Python custom op, so a
  partitioned program has to carry the wrapped body.
- ``keyword_only``: inputs passed by name from the factory (``(module, (), kwargs)``).
"""

from __future__ import annotations

import torch
from torch import nn


def stock_mha():
    torch.manual_seed(0)
    x = torch.randn(1, 10, 64)
    return nn.MultiheadAttention(64, 4, batch_first=True).eval(), (x, x, x)


def stock_encoder():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval(), \
        (torch.randn(1, 12, 64),)


class Bessel(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x):
        return self.linear(torch.special.i0(self.linear(x)))


def bessel():
    torch.manual_seed(0)
    return Bessel().eval(), (torch.randn(2, 16),)


@torch.library.custom_op("realworld::scale", mutates_args=())
def scale(x: torch.Tensor) -> torch.Tensor:
    return x * 0.5


@scale.register_fake
def _(x):
    return torch.empty_like(x)


class NoGradRotary(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 16, 2) / 16)))

    @torch.no_grad()
    def angles(self, x):
        positions = torch.arange(x.shape[1], dtype=torch.float32)
        freqs = positions[:, None] * self.inv_freq[None, :]
        return torch.cat([freqs, freqs], dim=-1).cos()

    def forward(self, x):
        h = self.linear(x) * self.angles(x)
        return self.linear(scale(h))


def no_grad_rotary():
    torch.manual_seed(0)
    return NoGradRotary().eval(), (torch.randn(1, 6, 16),)


class KeywordOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, input_ids=None, attention_mask=None):
        h = self.embed(input_ids) * attention_mask[..., None]
        return {"logits": self.head(h)}


def keyword_only():
    ids = torch.randint(0, 50, (1, 8), generator=torch.Generator().manual_seed(0))
    return KeywordOnly().eval(), (), {"input_ids": ids,
                                      "attention_mask": torch.ones(1, 8, dtype=torch.int64)}
