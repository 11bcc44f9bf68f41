"""The zoo's decoder at hidden 128: int4 weight-only quantizes in groups of 128 input
features, so the zoo's hidden 64 leaves every layer in float."""

from __future__ import annotations

import torch
from torch import nn

from exporter.zoo import Block, Embeddings

HIDDEN, HEADS, LAYERS, VOCAB, SEQ = 128, 4, 2, 256, 16


class WideDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = Embeddings(VOCAB, SEQ, HIDDEN)
        self.blocks = nn.ModuleList(Block(HIDDEN, HEADS) for _ in range(LAYERS))
        self.ln = nn.LayerNorm(HIDDEN)
        self.register_buffer("causal_mask", torch.full((SEQ, SEQ), float("-inf")).triu(1),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        s = input_ids.shape[1]
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, self.causal_mask[:s, :s])
        return self.ln(x) @ self.embed.tokens.weight.T  # tied output projection


def wide_decoder():
    torch.manual_seed(0)
    return WideDecoder().eval(), (torch.randint(0, VOCAB, (2, SEQ)),)
