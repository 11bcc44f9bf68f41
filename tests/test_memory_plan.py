"""Memory planning: the arena layout never puts two live tensors in the same bytes, and
on the zoo and a Hugging Face model it stays within 1.05x of the lower bound."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.zoo import ZOO
from passes.memory_plan import Buffer, best_fit, lower_bound, plan


@st.composite
def _buffers(draw) -> list[Buffer]:
    count = draw(st.integers(1, 40))
    out = []
    for i in range(count):
        start = draw(st.integers(0, 50))
        out.append(Buffer(f"b{i}", draw(st.integers(1, 64)) * 64, start,
                          start + draw(st.integers(0, 20))))
    return out


@settings(max_examples=300, deadline=None)
@given(_buffers())
def test_best_fit_never_overlaps_live_buffers(buffers):
    offsets = best_fit(buffers)
    arena = max(offsets[b.name] + b.size for b in buffers)
    for a in buffers:
        for b in buffers:
            if a.name < b.name and a.start <= b.end and b.start <= a.end:
                assert offsets[a.name] + a.size <= offsets[b.name] or \
                    offsets[b.name] + b.size <= offsets[a.name], (a, b)
    assert lower_bound(buffers) <= arena <= sum(b.size for b in buffers)


def _hf_bert():
    pytest.importorskip("transformers")
    from tests.models.hf_bert import tiny_bert
    model, args = tiny_bert()
    return model, args, None


@pytest.mark.parametrize("name", [*sorted(ZOO), "hf-bert"])
def test_arena_within_5_percent_of_the_lower_bound(name):
    model, args, dynamic = _hf_bert() if name == "hf-bert" else ZOO[name]()
    figures = plan(torch.export.export(model, args, dynamic_shapes=dynamic))
    print(name, {k: v for k, v in figures.items() if k != "offsets"})
    assert figures["arena_bytes"] <= 1.05 * figures["lower_bound_bytes"]
    assert figures["arena_bytes"] < figures["naive_bytes"]


def test_views_share_their_base_and_extend_its_life():
    class Views(torch.nn.Module):
        def forward(self, x):
            y = torch.relu(x)  # the only allocation besides the output
            z = y.reshape(4, 4).t()  # views of y: no buffers, y lives until z is read
            return z + 1

    figures = plan(torch.export.export(Views(), (torch.randn(16),)))
    assert figures["buffers"] == 2
    relu, add = sorted(figures["offsets"].values(), key=lambda row: row[2])
    assert relu[3] == add[2], "relu's buffer lives until the add that reads its view"
