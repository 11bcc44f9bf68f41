"""bench/int8_words_rest.py: the decode chain's variants with down's split, o's rows and
the head over int8 words (each beside its I2F twin), their launches against the
references under TRITON_INTERPRET=1 (or on a GPU), the script's list, and (on a Hopper
GPU) two layers of the chain with all three replayed in a CUDA graph."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from targets.aoti.kernels import reference
from tests.helpers import triton_device

pytest.importorskip("triton")

DEFAULT = {"qkv": (4, 1024, 4, 2048), "gate_up": (4, 1024, 4, 0),
           "down": (8, 512, 4, 512, False, 0, 11), "head": (8, 1024, 4, 1024)}


def test_the_variants_change_only_their_kernels():
    from bench.decode_chain_split import SplitLaunch
    from bench.int8_words_rest import (BASE, CHANGES, LibraryAttentionO, WordsHead,
                                       chain_names, words_variants)
    found = words_variants({BASE: (True, DEFAULT, None, True)})
    assert len(found) == len(CHANGES)
    assert found[f"{BASE} + nothing changed"][1] == DEFAULT
    for name, changes in CHANGES.items():
        pdl, configs, *rest = found[f"{BASE} + {name}"]
        assert pdl and rest == [None, True]
        assert {k: v for k, v in configs.items() if k not in changes} == {
            k: v for k, v in DEFAULT.items() if k not in changes}
        for product, (_, words) in changes.items():
            launch = configs[product]
            assert isinstance(launch, {"down": SplitLaunch, "head": WordsHead,
                                       "attention_o": LibraryAttentionO}[product])
            assert launch.words == words, (name, product)
    down = found[f"{BASE} + words down"][1]["down"]
    assert down.config == (8, 512, 4, 512, 11)  # the base's own split
    assert found[f"{BASE} + head argmax words"][1]["head"].config == (8, 1024, 4, 1024)
    names = chain_names()
    assert names[0] == BASE and names[-1] == f"{BASE} + nothing changed"
    assert set(names[1:]) == {f"{BASE} + {name}" for name in CHANGES}


def test_the_base_is_the_chains_and_the_chain_registers_the_variants():
    from bench import decode_chain_cuda
    from bench.decode_attention_o import CHANGES
    from bench.int8_words_rest import BASE
    source = Path(decode_chain_cuda.__file__).read_text()
    assert "attention-o joined {8 if int8 else 4} splits 4 rows" in source
    assert BASE.removeprefix("dependent + join + ") in CHANGES
    assert "words_variants(q_bases)" in source


def _int8(rows, cols, seed, device):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randint(-128, 128, (rows, cols), generator=generator, dtype=torch.int8)
    scale = (torch.rand(rows, generator=generator) * 2e-2 + 1e-2).half()
    return weight.to(device), scale.to(device)


def _close(got, want):
    error = (got.float().cpu() - want.float().cpu()).abs().max().item()
    assert error <= 2e-3 * max(1.0, want.float().abs().max().item()), error


@pytest.mark.parametrize("words", [False, True])
def test_the_split_and_head_launches_are_row_gemvs(words):
    device = triton_device()
    from bench.decode_chain_split import SplitLaunch
    from bench.int8_words_rest import WordsHead
    weight, scale = _int8(24, 256, 1, device)
    x = torch.randn(1, 1, 256).half().to(device)
    residual = torch.randn(1, 1, 24).half().to(device)
    split = SplitLaunch((4, 64, 4, 64, 2), words)
    for _ in range(2):  # its counters made once, left at zero
        _close(split(x, weight, scale, {"residual": residual}, False),
               reference.row_gemv(x, weight, None, None, residual, 1e-6, 0.0, 0, scale))
    assert not split.counts.any()
    norm = (torch.rand(256) + 0.5).half().to(device)
    head = WordsHead((8, 64, 4, 64), words)
    _close(head(x, weight, scale, {"norm": norm}, False),
           reference.row_gemv(x, weight, None, norm, None, 1e-5, 0.0, 0, scale))


@pytest.mark.parametrize("words", [0, 1, 2])
def test_the_library_attention_o_launch_is_the_reference(words):
    """The chain's library launch over a small layer: reference.decode_attention_o; the
    new rows written at its masked slot; plain launches left to the chain (None)."""
    device = triton_device()
    from bench.int8_words_rest import LibraryAttentionO
    heads, kv_heads, slots, dim = 8, 2, 512, 16
    generator = torch.Generator().manual_seed(3)

    def randn(*shape):
        return torch.randn(*shape, generator=generator).half().to(device)
    q, k, v = randn(1, heads, 1, dim), randn(1, kv_heads, 1, dim), randn(1, kv_heads, 1, dim)
    layer = {"k": randn(1, kv_heads, slots, dim), "v": randn(1, kv_heads, slots, dim),
             "o": _int8(48, heads * dim, 4, device)}
    mask = torch.zeros(1, 1, 1, slots + 1)
    mask[..., slots * 3 // 4:slots] = float("-inf")
    made = {"layers": [layer], "mask": mask.half().to(device)}
    h = randn(1, 1, 48)
    want = reference.decode_attention_o(
        *(t.cpu() for t in (q, layer["k"], k, layer["v"], v, made["mask"])), dim ** -0.5,
        True, torch.zeros(kv_heads, dtype=torch.int32), layer["o"][0].cpu(),
        layer["o"][1].cpu(), h.cpu(), torch.zeros(96, dtype=torch.int32), 0, 1)
    launch = LibraryAttentionO(words)
    assert launch(q, k, v, h, layer, made, False) is None
    _close(launch(q, k, v, h, layer, made, True), want)
    assert torch.equal(layer["k"][:, :, LibraryAttentionO.POSITION].cpu(), k[:, :, 0].cpu())


@pytest.mark.cuda
def test_an_all_words_chain_replays_in_a_cuda_graph():
    """Two layers of the int8 chain at the ~1.1B's shape, down, o and the head over words
    as dependent launches, captured and replayed: the base's plain launches' output."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a Hopper GPU")
    from bench.decode_chain_cuda import step, variants, weights
    from bench.int8_words_rest import BASE
    torch.manual_seed(0)
    made = weights(2, 512, int8=True)
    hidden = torch.randn(1, 1, 2048, device="cuda", dtype=torch.float16)
    chosen = variants(None, True)
    pdl, configs, *rest = chosen[f"{BASE} + all words"]
    want = step(made, hidden, False, chosen[BASE][1], *rest).float()  # the base, plain
    step(made, hidden, pdl, configs, *rest)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(made, hidden, pdl, configs, *rest)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        error = (out.float() - want).abs().max().item()
        assert error <= 2e-2 * max(1.0, want.abs().max().item()), error
