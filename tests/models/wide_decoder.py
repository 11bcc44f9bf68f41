"""The zoo's decoder at hidden 128: int4 weight-only quantizes in groups of up to 128
input features; at the zoo's hidden 64 only the smaller groups are exercised."""

from __future__ import annotations

import torch

from exporter.model.zoo import SEQ, VOCAB, Decoder


def wide_decoder():
    torch.manual_seed(0)
    return Decoder(hidden=128, heads=4).eval(), (torch.randint(0, VOCAB, (2, SEQ)),)
