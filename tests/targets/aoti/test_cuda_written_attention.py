"""The cuda target's rewrite of attention written out as matmul, softmax, matmul into one
scaled_dot_product_attention (targets/aoti/passes/written_attention.py). Checked against
eager on the CPU in half precision, marked cuda with the rest of the target's own tests."""

from __future__ import annotations

import copy

import pytest
import torch

from targets.aoti.passes.written_attention import WrittenAttentionAsSdpa

pytestmark = pytest.mark.cuda


class _WindowAttention(torch.nn.Module):
    """Swin's shape (timm without fused attention): the query scaled before q @ k^T, a
    relative-position bias gathered from a table, a shifted-window mask added through a
    5-d view, softmax, a dropout of p = 0, then @ v."""

    def __init__(self, windows: int = 4, heads: int = 2, tokens: int = 9,
                 width: int = 16) -> None:
        super().__init__()
        self.heads, self.scale = heads, (width // heads) ** -0.5
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.table = torch.nn.Parameter(torch.randn(2 * tokens - 1, heads))
        index = torch.arange(tokens)[:, None] - torch.arange(tokens)[None, :] + tokens - 1
        self.register_buffer("index", index)
        mask = torch.zeros(windows, tokens, tokens)
        mask[1::2, : tokens // 2, tokens // 2:] = -100.0
        self.register_buffer("mask", mask)
        self.drop = torch.nn.Dropout(0.0)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        bias = self.table[self.index.view(-1)].view(n, n, -1).permute(2, 0, 1).contiguous()
        attn = attn + bias.unsqueeze(0)
        windows = self.mask.shape[0]
        attn = attn.view(-1, windows, self.heads, n, n) + self.mask.unsqueeze(1).unsqueeze(0)
        attn = self.drop(attn.view(-1, self.heads, n, n).softmax(-1))
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class _ScaledAfter(torch.nn.Module):
    """An encoder of the older kind: scores divided by sqrt(d) after q @ k^T, a padding
    mask added, no bias on the scores' side; and a second head whose scores are also
    returned, which must stay written out."""

    def forward(self, q, k, v, pad):
        scores = q @ k.permute(0, 1, 3, 2) / 8.0 + pad
        kept = torch.softmax(scores, dim=-1) @ v
        seen = q @ k.transpose(-1, -2)
        return kept, torch.softmax(seen, -1) @ v, seen


def _ops(program) -> list[str]:
    return [str(n.target) for n in program.graph.nodes if n.op == "call_function"]


def _eager_float(model, *inputs):
    with torch.no_grad():
        return copy.deepcopy(model).float()(*(t.float() for t in inputs))


def test_swin_window_attention_becomes_one_attention_with_eager_values():
    torch.manual_seed(0)
    model = _WindowAttention().eval().half()
    x = torch.randn(4, 9, 16, dtype=torch.half)
    with torch.no_grad():
        result = WrittenAttentionAsSdpa()(torch.export.export(model, (x,)))
    assert result.modified and result.info["attentions_fused"] == 1
    ops = _ops(result.program)
    assert ops.count("aten.scaled_dot_product_attention.default") == 1
    assert "aten.matmul.default" not in ops and "aten.softmax.int" not in ops
    fresh = torch.randn(4, 9, 16, dtype=torch.half)
    got = result.program.module()(fresh)
    assert got.dtype == torch.half
    torch.testing.assert_close(got.float(), _eager_float(model, fresh), atol=5e-3, rtol=5e-3)


def test_scores_scaled_after_the_product_fused_scores_read_elsewhere_stay():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8, dtype=torch.half) for _ in range(3))
    pad = torch.zeros(2, 1, 1, 7, dtype=torch.half)
    pad[1, ..., 5:] = -1e4
    model = _ScaledAfter()
    result = WrittenAttentionAsSdpa()(torch.export.export(model, (q, k, v, pad)))
    assert result.info["attentions_fused"] == 1
    ops = _ops(result.program)
    assert ops.count("aten.matmul.default") == 2  # the head whose scores are an output
    fresh = [torch.randn(2, 3, 7, 8, dtype=torch.half) for _ in range(3)]
    wants = _eager_float(model, *fresh, pad)
    for got, want in zip(result.program.module()(*fresh, pad), wants):
        torch.testing.assert_close(got.float(), want, atol=5e-3, rtol=5e-3)


@pytest.mark.parametrize("dtype, key_batch", [(torch.float32, 2), (torch.half, 1)],
                         ids=["float32", "broadcast_keys"])
def test_float32_and_broadcast_keys_stay_written_out(dtype, key_batch):
    class Plain(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.softmax(q @ k.transpose(-2, -1), -1) @ v

    q = torch.randn(2, 3, 5, 8, dtype=dtype)
    k = torch.randn(key_batch, 3, 5, 8, dtype=dtype)
    result = WrittenAttentionAsSdpa()(torch.export.export(Plain(), (q, k, k)))
    assert not result.modified
