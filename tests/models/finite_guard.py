"""Models that guard fp16 overflow with a data-dependent ``if`` on tensor data, as
transformers' BART, T5 and LongT5 do: the capture takes the repair branch (the clamp)."""

import torch
from torch.export import Dim


class Guarded(torch.nn.Module):
    """The guard's spellings: any of isinf, not all of isfinite, isinf or isnan (each
    Python ``or`` and tensor ``|``), and a ``.item()``."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        limit = torch.finfo(x.dtype).max - 1000
        h = self.linear(x)
        if torch.isinf(h).any():
            h = torch.clamp(h, -limit, limit)
        h = h * 2
        if not torch.isfinite(h).all():
            h = torch.clamp(h, -limit, limit)
        h = h + 1
        if torch.isinf(h).any() or torch.isnan(h).any():
            h = torch.nan_to_num(h)
        if (torch.isinf(h) | torch.isnan(h)).any().item():
            h = torch.clamp(h, -limit, limit)
        return h


def factory():
    torch.manual_seed(0)
    return Guarded().eval(), (torch.randn(2, 8),), ({0: Dim("batch", min=1, max=8)},)


class BartHidden(torch.nn.Module):
    """A tiny random-weight BART (its encoder and decoder layers carry the fp16 guard)."""

    def __init__(self):
        super().__init__()
        import transformers
        config = transformers.BartConfig(
            vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
            decoder_ffn_dim=32, max_position_embeddings=32, use_cache=False)
        self.bart = transformers.BartModel(config)

    def forward(self, input_ids):
        return self.bart(input_ids=input_ids).last_hidden_state


def bart_factory():
    torch.manual_seed(0)
    return BartHidden().eval(), (torch.randint(3, 64, (1, 8)),), None
