"""bench/int8_cvt_rows.py's int8 rows made fp32 by integer ops against reference.row_gemv
and the library's int8 kernel (the folds the decode chain gives them), the byte forms'
bits, and the chain variants and pending script's names. Under TRITON_INTERPRET=1 on the
CPU, or on a GPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.helpers import triton_device

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]


def _prmt(a: int, b: int, selector: int) -> int:
    """PTX prmt.b32's default mode: result byte i is byte (selector nibble i) of b:a."""
    pool = (b << 32 | a).to_bytes(8, "little")
    return int.from_bytes(bytes(pool[selector >> 4 * i & 7] for i in range(4)), "little")


def test_every_byte_becomes_its_exact_float_in_both_forms():
    """A word's byte k (an int8 weight), with its sign bit flipped, under the exponent of
    2^23, less 2^23 + 128: the weight exactly; the permute (the GPU's form) and the
    shifts and masks (the interpreter's) give the same bits."""
    import struct
    for byte in range(256):
        value = byte - 256 if byte >= 128 else byte
        for k in range(4):
            word = (0x5A << 8 * ((k + 1) % 4) | byte << 8 * k) & 0xFFFFFFFF
            shifted = ((word >> 8 * k) & 0xFF) ^ 0x4B000080
            permuted = _prmt(word ^ 0x80808080, 0x4B000000, 0x7650 + k)
            assert shifted == permuted
            as_float = struct.unpack("<f", struct.pack("<I", shifted))[0]
            assert as_float - 8388736.0 == value


def _rows(rows, k, device, seed, full=False):
    generator = torch.Generator().manual_seed(seed)
    low = -128 if full else -127
    weight = torch.randint(low, 128, (rows, k), generator=generator, dtype=torch.int8)
    scale = torch.rand(rows, generator=generator) * 2e-2 + 1e-2
    return weight.to(device), scale.to(device, torch.float16)


def _made(*size, seed, scale=1.0, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(size, generator=generator) * scale).to(device, torch.float16)


def test_integer_sums_are_exact_and_the_library_kernels():
    """Every byte value in each row, x small integers in fp32, scale 1: every sum an
    exact integer, so a byte lost, moved to another column or read with the wrong sign
    differs from the float64 product, and from the library's kernel."""
    device = triton_device()
    from bench.int8_cvt_rows import launch_cvt_rows
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    cols = torch.arange(256, device=device)
    weight = ((torch.arange(24, device=device)[:, None] * 37 + 11 * cols) % 256 - 128)
    weight = weight.to(torch.int8)
    scale = torch.ones(24, device=device)
    x = (1 + cols % 5 + 3 * (cols >= 128)).float().reshape(1, 1, 256)
    want = weight.double() @ x.double().reshape(-1)
    for config in [(4, 64, 4, 0), (2, 128, 4, 64), (8, 64, 4, 256)]:
        got = launch_cvt_rows(x, weight, scale, None, None, 0, config)
        assert torch.equal(got.double().reshape(-1), want), config
    library = launch_row_gemv(x, weight, None, None, None, 1e-6, 0.0, 0, (4, 64, 4, 0),
                              weight_scale=scale)
    assert torch.equal(library.double().reshape(-1), want)


@pytest.mark.parametrize("n, k, act, norm, res, config", [
    (40, 96, 1, True, False, (2, 64, 4, 0)),  # gate/up: the norm, a masked last tile
    (36, 128, 0, True, False, (4, 64, 4, 128)),  # q/k/v: the whole row ahead
    (40, 128, 0, True, False, (8, 64, 4, 64)),  # head: the first tile ahead
    (41, 64, 0, False, True, (4, 32, 4, 0)),  # a residual, a part block
    (24, 64, 1, True, True, (4, 64, 2, 32)),  # gated with columns ahead and a residual
])
def test_int8_rows_by_integer_ops_are_row_gemvs(n, k, act, norm, res, config):
    device = triton_device()
    from bench.int8_cvt_rows import launch_cvt_rows
    from targets.aoti.kernels.reference import row_gemv
    weight, scale = _rows(2 * n if act else n, k, device, 6, full=True)
    x = _made(1, 1, k, seed=1, device=device)
    nw = _made(k, seed=2, scale=0.1, device=device) + 1.0 if norm else None
    r = _made(1, 1, n, seed=3, device=device) if res else None
    got = launch_cvt_rows(x, weight, scale, nw, r, act, config)
    want = row_gemv(x, weight, None, nw, r, 1e-5, 0.0, act, scale)
    error = (got.float() - want.float()).abs().max().item()
    assert error <= 2e-3 * max(1.0, want.float().abs().max().item()), error


def test_bad_rows_and_configs_are_refused():
    from bench.int8_cvt_rows import launch_cvt_rows
    x = torch.zeros(1, 1, 64, dtype=torch.float16)
    scale = torch.ones(8, dtype=torch.float16)
    with pytest.raises(ValueError, match="multiple of 4"):
        launch_cvt_rows(torch.zeros(1, 1, 62), torch.zeros(8, 62, dtype=torch.int8), scale,
                        None, None, 0, (4, 64, 4, 0))
    with pytest.raises(ValueError, match="AHEAD"):
        launch_cvt_rows(x, torch.zeros(8, 64, dtype=torch.int8), scale, None, None, 0,
                        (4, 64, 4, 24))


def test_the_variants_change_only_their_products():
    from bench.int8_cvt_rows import BASE, CHANGES, CvtLaunch, chain_names, cvt_variants
    default = {"qkv": (4, 1024, 4, 2048), "gate_up": (2, 1024, 4, 0),
               "head": (8, 1024, 4, 1024), "down": (4, 1024, 4, 2048, False, 0, 4)}
    found = cvt_variants({BASE: (True, default, None, True)})
    assert len(found) == len(CHANGES)
    pdl, configs, *rest = found[f"{BASE} + i2f-free gate/up + q/k/v + head"]
    assert pdl and rest == [None, True] and configs["down"] == default["down"]
    assert [configs[p].config for p in ("qkv", "gate_up", "head")] == [
        default["qkv"], default["gate_up"], default["head"]]
    assert repr(configs["gate_up"]) == "i2f-free(2, 1024, 4, 0)"
    library = found[f"{BASE} + library gate/up 4 rows"][1]["gate_up"]
    assert library == (4, 1024, 4, 0) and not isinstance(library, CvtLaunch)
    assert found[f"{BASE} + nothing changed"][1] == default
    names = chain_names()
    assert names[0] == BASE and names[-1] == f"{BASE} + nothing changed"
    assert set(names[1:]) == {f"{BASE} + {name}" for name in CHANGES}


def test_the_base_and_the_pending_script_are_the_chains():
    """BASE is the int8 chain's attention-o base in decode_chain_cuda.py; the script asks
    for int8_cvt_rows.py's own list."""
    from bench import decode_chain_cuda
    from bench.decode_attention_o import CHANGES
    from bench.int8_cvt_rows import BASE
    source = Path(decode_chain_cuda.__file__).read_text()
    assert "attention-o joined {8 if int8 else 4} splits 4 rows" in source
    assert BASE.removeprefix("dependent + join + ") in CHANGES
    assert "cvt_variants(q_bases)" in source
    script = (ROOT / "bench" / "pending" / "int8_cvt_chain.sh").read_text()
    assert re.search(r'--int8 --rounds 60 --variants "\$\(python3 bench/int8_cvt_rows.py '
                     r'--chain\)"', script)


def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a Hopper GPU")


@pytest.mark.cuda
def test_an_i2f_free_chain_replays_in_a_cuda_graph():
    """Two layers of the int8 chain at the ~1.1B's shape, q/k/v, gate/up (4 rows) and the
    head on the integer-op kernel (its PRMT form) as dependent launches, captured and
    replayed: the base's plain launches' output each replay."""
    _hopper()
    from bench.decode_chain_cuda import step, variants, weights
    from bench.int8_cvt_rows import BASE
    torch.manual_seed(0)
    made = weights(2, 512, int8=True)
    hidden = torch.randn(1, 1, 2048, device="cuda", dtype=torch.float16)
    chosen = variants(None, True)
    pdl, configs, *rest = chosen[f"{BASE} + i2f-free gate/up 4 rows + q/k/v + head"]
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
