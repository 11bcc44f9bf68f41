"""The decode chain's ``--int4`` products (bench/decode_chain_int4.py): int4 rows launched
as a build launches them compute what the fp16 chain computes over the same rows
unpacked, and each variant's configuration computes what the default does. A small chain
on the CPU under ``TRITON_INTERPRET=1`` (or on a GPU)."""

from __future__ import annotations

import pytest
import torch

from tests.bench.test_decode_chain_split import _small_chain
from tests.helpers import triton_device

pytest.importorskip("triton")


def _int4_chain(monkeypatch, device, layers=1):
    """The toy chain with each product's rows as int4 rows (groups of 32), and the same
    chain with those rows unpacked back to fp16."""
    from targets.aoti.kernels import int4_rows, reference
    chain, weights, hidden = _small_chain(monkeypatch, device, layers=layers)
    packed = {**weights, "layers": [dict(layer) for layer in weights["layers"]]}
    unpacked = {**weights, "layers": [dict(layer) for layer in weights["layers"]]}
    for rows_of, back in zip(packed["layers"] + [packed], unpacked["layers"] + [unpacked]):
        for name in ("qkv", "o", "gate_up", "down", "head"):
            if name in rows_of:
                rows_of[name] = int4_rows.pack(rows_of[name][0].float(), 32)
                back[name] = (reference.int4_weight(*rows_of[name]).half(), None)
    return chain, packed, unpacked, hidden


def _close(got, want):
    return (got - want).abs().max().item() < 2e-2 * want.abs().max().item()


def test_the_int4_chain_computes_what_the_fp16_chain_computes_over_its_rows(monkeypatch):
    device = triton_device()
    from bench.decode_chain_int4 import launches
    chain, packed, unpacked, hidden = _int4_chain(monkeypatch, device)
    want = chain.step(unpacked, hidden, False, {}, join=True).float()
    got = chain.step(packed, hidden, False, launches({}, ()), join=True).float()
    assert _close(got, want)


def test_the_int4_chain_rotates_q_and_k_as_its_reference(monkeypatch):
    """q/k/v's rotary fold (a build's) in the chain: the rotated rows of the first
    layer's q/k/v, against reference.row_gemv with the same tables."""
    device = triton_device()
    from bench.decode_chain_int4 import Int4Launch, rotary_tables
    from targets.aoti.kernels import reference
    chain, packed, _, hidden = _int4_chain(monkeypatch, device)
    cos, sin = rotary_tables(16, device)
    rows, scales = packed["layers"][0]["qkv"]
    norm = packed["norm"]
    got = Int4Launch(None, (cos, sin, 96, 16))(hidden, rows, scales, {"norm": norm}, False)
    want = reference.row_gemv(hidden, rows, None, norm, None, 1e-5, 0.0, 0, scales,
                              rotary_cos=cos, rotary_sin=sin, rotary_rows=96, head_dim=16)
    assert _close(got.float(), want.float())


@pytest.mark.parametrize("name", [
    "gate/up 8 rows 8 warps", "gate/up 2 rows", "down 4 rows 32 groups",
    "o 4 rows 8 warps", "q/k/v 2 rows 16 groups", "head 16 rows 8 warps"])
def test_an_int4_variant_computes_what_the_int4_chain_computes(monkeypatch, name):
    """A variant's configurations (sized for the ~1.1B, masked down to toy rows here),
    q/k/v rotated in both."""
    device = triton_device()
    from bench.decode_chain_int4 import CHANGES, launches, rotary_tables
    chain, packed, _, hidden = _int4_chain(monkeypatch, device)
    rotary = (*rotary_tables(16, device), 96, 16)
    want = chain.step(packed, hidden, False, launches({}, rotary), join=True).float()
    got = chain.step(packed, hidden, False, launches(CHANGES[name], rotary), join=True)
    assert _close(got.float(), want)


def test_shared_launches_read_the_first_layers_rows_and_null_ones_only_write(monkeypatch):
    device = triton_device()
    from bench.decode_chain_int4 import NullLaunch, launches
    chain, packed, _, hidden = _int4_chain(monkeypatch, device, layers=2)
    products = ("qkv", "o", "gate_up", "down")
    first = {**packed, "layers": [{**layer, **{name: packed["layers"][0][name]
                                               for name in products}}
                                  for layer in packed["layers"]]}
    want = chain.step(first, hidden, False, launches({}, ()), join=True).float()
    got = chain.step(packed, hidden, False, launches({}, (), shared=True), join=True)
    assert _close(got.float(), want)
    null = launches({"o": NullLaunch()}, ())
    assert isinstance(null["o"], NullLaunch) and repr(null["qkv"]) == "int4"
    o = null["o"](hidden, *packed["layers"][0]["o"], {"residual": hidden}, False)
    assert o.shape == (1, 1, 64) and torch.equal(o, hidden)
