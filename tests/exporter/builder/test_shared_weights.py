"""The shared weight store: one copy per content, whichever entry point lowered it."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from exporter.builder.shared_weights import content_key, share_weights
from targets.base import Lowered


def test_equal_tensors_of_two_entry_points_are_stored_once(tmp_path):
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(64, 32, generator=gen), torch.randn(64, generator=gen)
    prefill = Lowered(files={}, meta={}, requirements=None,
                      weights={"w": weight, "b": bias, "head": weight.clone()})
    decode = Lowered(files={}, meta={}, requirements=None, weights={"w": weight.clone(), "b": bias})
    record, files = share_weights([prefill, decode], tmp_path)
    key_w, key_b = content_key(weight), content_key(bias)
    assert prefill.meta["shared_weights"] == {"w": key_w, "b": key_b, "head": key_w}
    assert decode.meta["shared_weights"] == {"w": key_w, "b": key_b}
    assert prefill.weights == {} and decode.weights == {}
    (path,) = files.values()
    stored = load_file(str(path))
    assert sorted(stored) == sorted({key_w, key_b})
    assert torch.equal(stored[key_w], weight) and torch.equal(stored[key_b], bias)
    assert record["bytes"] == (64 * 32 + 64) * 4
    assert content_key(weight.to(torch.float16)) != key_w  # the dtype is part of the key
