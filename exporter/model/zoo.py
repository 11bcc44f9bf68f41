"""Built-in model zoo: small models with random, deterministic weights.

Used by ``zoo:NAME`` specs, tests and demos. Nothing is downloaded; every factory
seeds its own RNG inside ``torch.random.fork_rng()`` so building a zoo model never
disturbs the caller's global random state, and two builds give identical weights.

Each factory returns ``(module_in_eval_mode, example_args, dynamic_shapes)`` where
``dynamic_shapes`` is in ``torch.export``'s own format: a tuple matching the args,
one ``{dim_index: Dim}`` dict (or None) per argument.

The batch dim is declared ``Dim("batch", min=1, max=32)``. With torch 2.13, min=1 is
accepted as is: export keeps the range [1, 32] (no 0/1 specialization error) as long
as the example batch is >= 2, which is why every example below uses batch 2.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

SEED = 0
BATCH = 2  # example batch: 1 would make export specialize the batch dim to a constant
MAX_BATCH = 32
SEQ = 16
VOCAB = 256
HIDDEN = 64
HEADS = 4
LAYERS = 2

Factory = Callable[[], tuple[nn.Module, tuple, tuple]]


def _batch_dim() -> Dim:
    return Dim("batch", min=1, max=MAX_BATCH)


# ---------------------------------------------------------------------------- mlp


class MLP(nn.Module):
    def __init__(self, features: int = 64, hidden: int = 128, classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


# ---------------------------------------------------------------------------- cnn


class BasicBlock(nn.Module):
    """ResNet basic block; a 1x1 projection on the skip path when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = nn.Identity()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.skip(x))


class SmallResNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU())
        self.layer1 = BasicBlock(16, 16, 1)
        self.layer2 = BasicBlock(16, 32, 2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(32, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(self.stem(image)))
        return self.head(torch.flatten(self.pool(x), 1))


def _randomize_batchnorm(model: nn.Module) -> None:
    """Give BatchNorm non-trivial running stats, so eval mode is not an identity."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.1, 0.1)


# ---------------------------------------------------------------------------- transformers


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # mask: additive float mask broadcastable to [batch, heads, seq, seq]
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        # Written out (not F.scaled_dot_product_attention) so the graph shows the
        # matmul/softmax pattern that fusion passes look for.
        scores = q @ k.transpose(-2, -1) / math.sqrt(h // self.heads) + mask
        ctx = torch.softmax(scores, dim=-1) @ v
        return self.out(ctx.transpose(1, 2).reshape(b, s, h))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: attention and GELU MLP, each with a residual."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = SelfAttention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(),
                                 nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


class Embeddings(nn.Module):
    def __init__(self, vocab: int, seq: int, hidden: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Parameter(torch.randn(seq, hidden) * 0.02)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.tokens(input_ids) + self.positions[: input_ids.shape[1]]


class Encoder(nn.Module):
    """BERT-like encoder; returns a dict so the output signature is a pytree."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = Embeddings(VOCAB, SEQ, HIDDEN)
        self.blocks = nn.ModuleList(Block(HIDDEN, HEADS) for _ in range(LAYERS))
        self.ln = nn.LayerNorm(HIDDEN)
        self.pool = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
        # the model's own dtype, as Hugging Face models do, so model.to(fp16) works
        dtype = self.ln.weight.dtype
        keep = attention_mask[:, None, None, :].to(dtype)  # [b, 1, 1, s]
        mask = (1.0 - keep) * torch.finfo(dtype).min
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, mask)
        x = self.ln(x)
        return {"last_hidden_state": x, "pooled": torch.tanh(self.pool(x[:, 0]))}


class Decoder(nn.Module):
    """GPT-like causal decoder with a tied output projection."""

    def __init__(self, hidden: int = HIDDEN, heads: int = HEADS) -> None:
        super().__init__()
        self.embed = Embeddings(VOCAB, SEQ, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(LAYERS))
        self.ln = nn.LayerNorm(hidden)
        causal = torch.full((SEQ, SEQ), float("-inf")).triu(1)
        # a buffer, not recomputed per call: a constant for export
        self.register_buffer("causal_mask", causal, persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        s = input_ids.shape[1]
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, self.causal_mask[:s, :s])
        return self.ln(x) @ self.embed.tokens.weight.T


# ---------------------------------------------------------------------------- factories


def _seeded(build: Callable[[], nn.Module]) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = build()
    return model.eval()


def _token_ids() -> torch.Tensor:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED + 1)
        return torch.randint(0, VOCAB, (BATCH, SEQ), dtype=torch.int64)


def _random(*shape: int) -> torch.Tensor:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED + 1)
        return torch.randn(*shape)


def make_mlp() -> tuple[nn.Module, tuple, tuple]:
    return _seeded(MLP), (_random(BATCH, 64),), ({0: _batch_dim()},)


def make_cnn() -> tuple[nn.Module, tuple, tuple]:
    def build() -> nn.Module:
        model = SmallResNet()
        with torch.no_grad():
            _randomize_batchnorm(model)
        return model

    return _seeded(build), (_random(BATCH, 3, 32, 32),), ({0: _batch_dim()},)


def make_encoder() -> tuple[nn.Module, tuple, tuple]:
    batch = _batch_dim()  # one Dim object shared: both inputs have the same batch
    ids = _token_ids()
    mask = torch.ones_like(ids)
    return _seeded(Encoder), (ids, mask), ({0: batch}, {0: batch})


def make_decoder() -> tuple[nn.Module, tuple, tuple]:
    return _seeded(Decoder), (_token_ids(),), ({0: _batch_dim()},)


ZOO: dict[str, Factory] = {
    "mlp": make_mlp,
    "cnn": make_cnn,
    "encoder": make_encoder,
    "decoder": make_decoder,
}

_DESCRIPTIONS = {
    "mlp": "3-layer perceptron with ReLU; x float32 [batch, 64] -> logits [batch, 10]",
    "cnn": "ResNet-style CNN (stem + 2 basic blocks, BatchNorm); image float32 [batch, 3, 32, 32]"
           " -> logits [batch, 10]",
    "encoder": f"{LAYERS}-layer transformer encoder; input_ids, attention_mask int64 [batch, {SEQ}]"
               " -> {last_hidden_state, pooled}",
    "decoder": f"{LAYERS}-layer causal GPT-style decoder; input_ids int64 [batch, {SEQ}]"
               f" -> logits [batch, {SEQ}, {VOCAB}]",
}


def describe() -> dict[str, str]:
    """One line per zoo model, for ``exporter zoo`` listings and error hints."""
    return {name: _DESCRIPTIONS[name] for name in ZOO}
