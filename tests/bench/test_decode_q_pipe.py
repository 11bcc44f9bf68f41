"""bench/q_pipe_rows.py's and q_pipe_int4.py's pipelined row products against
reference.row_gemv (int8 rows with a scale a row, int4 rows in groups with their (scale,
offset), the folds a decode step gives them), and decode_q_pipe.py's chain variants and
the pending script's names. Under TRITON_INTERPRET=1 on the CPU, or on a GPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.helpers import triton_device

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]


def _made(*size, seed, scale=1.0, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(size, generator=generator) * scale).to(device, torch.float16)


def _close(got, want):
    error = (got.float() - want.float()).abs().max().item()
    assert error <= 2e-2 * max(1.0, want.float().abs().max().item()), error


def _folds(n, k, norm, res, rot, device):
    x = _made(1, 1, k, seed=1, device=device)
    nw = _made(k, seed=2, scale=0.1, device=device) + 1.0 if norm else None
    r = _made(1, 1, n, seed=3, device=device) if res else None
    cos = _made(16, seed=4, device=device) if rot else None
    sin = _made(16, seed=5, device=device) if rot else None
    return x, nw, r, cos, sin


@pytest.mark.parametrize("n, k, act, norm, res, int8, rot, config", [
    (40, 96, 1, True, False, True, 0, (2, 32, 4, 32, 3, 2)),  # gate/up, ahead, 2 turns
    (41, 96, 0, False, True, True, 0, (4, 32, 4, 0, 3, 3)),  # residual, a part turn
    (40, 96, 0, True, False, False, 0, (2, 128, 4, 0, 2, 4)),  # one tile, 16-bit rows
    (36, 64, 0, True, False, True, 32, (4, 16, 4, 16, 3, 2)),  # rotary rows
    (24, 64, 1, True, True, True, 0, (1, 64, 2, 0, 4, 5)),  # one tile a gated row
    (40, 96, 1, True, False, True, 0, (2, 32, 4, 128, 3, 3)),  # the first block whole
    (36, 64, 0, True, True, True, 32, (4, 64, 4, 64, 2, 2)),  # whole, rotary, residual
    (40, 64, 1, True, True, True, 0, (2, 64, 4, 0, 3, 3, True)),  # x read once
])
def test_int8_rows_through_the_pipeline_are_row_gemvs(n, k, act, norm, res, int8, rot,
                                                      config):
    device = triton_device()
    from bench.q_pipe_rows import launch_q_pipe_rows
    from targets.aoti.kernels.reference import row_gemv
    rows = 2 * n if act else n
    generator = torch.Generator().manual_seed(6)
    if int8:
        weight = torch.randint(-127, 128, (rows, k), generator=generator,
                               dtype=torch.int8).to(device)
        scale = (torch.rand(rows, generator=generator) * 2e-2 + 1e-2).to(device,
                                                                         torch.float16)
    else:
        weight, scale = _made(rows, k, seed=6, scale=0.1, device=device), None
    x, nw, r, cos, sin = _folds(n, k, norm, res, rot, device)
    got = launch_q_pipe_rows(x, weight, scale, nw, r, act, config, rotary_cos=cos,
                             rotary_sin=sin, rotary_rows=rot, head_dim=16 if rot else 0)
    _close(got, row_gemv(x, weight, None, nw, r, 1e-5, 0.0, act, scale, cos, sin, rot,
                         16 if rot else 0))


@pytest.mark.parametrize("n, k, group, act, norm, res, rot, config", [
    (40, 256, 32, 1, True, False, 0, (2, 2, 4, 1, 3, 2, True)),  # gate/up, held
    (42, 256, 32, 0, False, True, 0, (4, 2, 4, 0, 3, 3, False)),  # residual, a part turn
    (40, 384, 128, 0, True, False, 0, (2, 2, 4, 1, 2, 4, False)),  # a masked last step
    (36, 256, 64, 0, True, False, 32, (4, 4, 4, 0, 3, 2, False)),  # rotary, one step
    (40, 384, 128, 1, True, False, 0, (2, 2, 4, 2, 3, 3, True)),  # the first row whole
    (36, 256, 32, 0, True, True, 32, (4, 4, 4, 2, 2, 2, False)),  # whole, rotary, residual
])
def test_int4_rows_through_the_pipeline_are_row_gemvs(n, k, group, act, norm, res, rot,
                                                      config):
    device = triton_device()
    from bench.q_pipe_int4 import launch_q_pipe_int4
    from targets.aoti.kernels import int4_rows
    from targets.aoti.kernels.reference import row_gemv
    rows = 2 * n if act else n
    packed, scales = (t.to(device) for t in int4_rows.pack(
        _made(rows, k, seed=7, scale=0.1), group))
    x, nw, r, cos, sin = _folds(n, k, norm, res, rot, device)
    got = launch_q_pipe_int4(x, packed, scales, nw, r, act, config, rotary_cos=cos,
                             rotary_sin=sin, rotary_rows=rot, head_dim=16 if rot else 0)
    _close(got, row_gemv(x, packed, None, nw, r, 1e-5, 0.0, act, scales, cos, sin, rot,
                         16 if rot else 0))


def test_configurations_the_kernels_cannot_compute_are_refused():
    from bench.q_pipe_int4 import check_int4_config
    from bench.q_pipe_rows import check_rows_config
    for config in [(2, 32, 4, 48, 3, 1), (2, 128, 4, 32, 3, 1), (2, 32, 4, 96, 3, 1),
                   (2, 32, 4, 0, 0, 1), (2, 32, 4, 128, 3, 1), (2, 32, 4, 0, 3, 1, True)]:
        with pytest.raises(ValueError, match="q-pipe config"):
            check_rows_config(config, 96)
    for config in [(4, 8, 4, 2, 3, 1, False), (4, 16, 4, 1, 3, 1, False),
                   (4, 6, 4, 0, 3, 1, False), (4, 8, 4, 3, 3, 2, False)]:
        with pytest.raises(ValueError, match="q-pipe int4 config"):
            check_int4_config(config, 16)


def test_chain_launches_take_the_chains_folds():
    """QPipeLaunch and QPipeInt4Launch as decode_chain_cuda.step calls them: ``fold``
    holds the norm, the gate or the residual; q/k/v's int4 launch its rotary rows."""
    device = triton_device()
    from bench.decode_q_pipe import QPipeInt4Launch, QPipeLaunch
    from targets.aoti.kernels import int4_rows
    from targets.aoti.kernels.reference import row_gemv
    x, nw, _, cos, sin = _folds(0, 64, True, False, True, device)
    weight = torch.randint(-127, 128, (48, 64), dtype=torch.int8).to(device)
    scale = torch.full((48,), 1e-2, dtype=torch.float16, device=device)
    launch = QPipeLaunch((2, 64, 4, 0, 3, 2))
    _close(launch(x, weight, scale, {"norm": nw, "act": 1}, False),
           row_gemv(x, weight, None, nw, None, 1e-5, 0.0, 1, scale))
    assert repr(launch) == "q-pipe(2, 64, 4, 0, 3, 2)"
    packed, scales = (t.to(device) for t in int4_rows.pack(_made(40, 64, seed=8), 32))
    turned = QPipeInt4Launch((4, 2, 4, 0, 3, 2, False), (cos, sin, 32, 16))
    _close(turned(x, packed, scales, {"norm": nw}, False),
           row_gemv(x, packed, None, nw, None, 1e-5, 0.0, 0, scales, cos, sin, 32, 16))


def test_the_variants_change_only_their_products_and_fit_the_1b_shapes():
    from bench.decode_q_pipe import (INT4_CHANGES, INT8_CHANGES, SHAPES, QPipeInt4Launch,
                                     QPipeLaunch, q_pipe_int4_variants, q_pipe_variants)
    from bench.q_pipe_int4 import check_int4_config
    from bench.q_pipe_rows import check_rows_config
    default = {"qkv": (4, 1024, 4, 2048), "gate_up": (2, 1024, 4, 0)}
    found = q_pipe_variants({"dependent + join": (True, default, None, True)})
    assert len(found) == len(INT8_CHANGES)
    pdl, configs, *rest = found["dependent + join + q-pipe gate/up 2 rows one tile 3 "
                                "stages 4 turns"]
    assert pdl and rest == [None, True] and configs["qkv"] == default["qkv"]
    assert isinstance(configs["gate_up"], QPipeLaunch)
    rotary = ("cos", "sin", 2304, 64)
    base = {"qkv": type("Int4Launch", (), {"rotary": rotary})(), "o": "o launch"}
    found = q_pipe_int4_variants({"int4 dependent + join": (True, base, None, True)})
    assert len(found) == len(INT4_CHANGES)
    configs = found["int4 dependent + join + q-pipe q/k/v 4 rows one step 3 stages 2 "
                    "turns"][1]
    assert isinstance(configs["qkv"], QPipeInt4Launch) and configs["qkv"].rotary == rotary
    assert configs["o"] == "o launch"
    for changes, check in ((INT8_CHANGES, check_rows_config),
                           (INT4_CHANGES, check_int4_config)):
        for products in changes.values():
            for product, config in products.items():
                n, k, *_, rotated = SHAPES[product]
                check(config, k if check is check_rows_config else k // 128)
                assert check is check_rows_config or not rotated or rotated % config[0] == 0


def test_the_bases_are_variants_the_chain_has():
    """The attention-o bases are decode_attention_o's names (the int8 chain's 8 splits, the
    others' 4, as attention_o_slots.attention_splits gives a library)."""
    from bench import decode_chain_cuda, decode_chain_int4
    from bench.decode_attention_o import CHANGES, INT4_CHANGES
    from bench.decode_q_pipe import INT4_BASES
    from targets.aoti.kernels.attention_o_slots import attention_splits
    source = Path(decode_chain_cuda.__file__).read_text()
    for int8 in (True, False):
        name = f"attention-o joined {attention_splits(int8)} splits 4 rows"
        assert name in CHANGES
    assert "attention-o joined {8 if int8 else 4} splits 4 rows" in source
    assert '"int4 dependent + join"' in Path(decode_chain_int4.__file__).read_text()
    assert INT4_BASES[0] == "int4 dependent + join"
    assert INT4_BASES[1].removeprefix("int4 dependent + join + ") in INT4_CHANGES
    assert attention_splits(False) == 4


def test_the_pending_script_asks_for_variants_the_bench_has():
    """Each ``chain`` call's ``--chain`` list, its ``--base`` and ``--only`` as bash
    expands the script's variables: names decode_q_pipe.py has."""
    import subprocess
    from bench.decode_q_pipe import INT4_BASES, INT4_CHANGES, INT8_CHANGES, chain_names
    script = (ROOT / "bench" / "pending" / "q_pipe_chain.sh").read_text()
    assigned = "\n".join(line for line in script.splitlines()
                         if re.match(r"^[A-Z0-9]+\+?=", line))
    asked = re.findall(r'^chain \w+ [\w-]+ "\$\(\$Q --chain (int8|int4)'
                       r'(?: --base "(\$\w+)")?(?: --only "(\$\w+)")?\)"$', script, re.M)
    assert sorted(width for width, *_ in asked) == ["int4", "int4", "int8", "int8"]
    for width, base, only in asked:
        base, only = subprocess.run(
            ["bash", "-c", f'{assigned}\nprintf "%s\\n%s" "{base}" "{only}"'],
            capture_output=True, text=True, check=True).stdout.split("\n")
        int4 = width == "int4"
        changes = INT4_CHANGES if int4 else INT8_CHANGES
        bases = INT4_BASES if int4 else (
            "dependent + join", "dependent + join + attention-o joined 8 splits 4 rows")
        assert not base or base in bases
        picked = tuple(name for name in only.split(";") if name)
        assert all(name in changes for name in picked) and (not only or len(picked) > 2)
        names = chain_names(int4, base or None, picked)
        assert names[0] == (base or bases[0]) and len(names) > 2


def _hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a Hopper GPU")


@pytest.mark.cuda
@pytest.mark.parametrize("int4", [False, True])
def test_a_q_pipe_chain_replays_in_a_cuda_graph(int4):
    """Two layers of the int8 (int4) chain at the ~1.1B's shape, every changed product of
    one variant pipelined, as dependent launches captured and replayed: the plain
    launches' output each replay."""
    _hopper()
    from bench import decode_chain_int4
    from bench.decode_chain_cuda import step, variants, weights
    from bench.decode_q_pipe import q_pipe_int4_variants
    torch.manual_seed(0)
    made = weights(2, 512, int8=not int4)
    hidden = torch.randn(1, 1, 2048, device="cuda", dtype=torch.float16)
    if int4:
        made = decode_chain_int4.int4_weights(made)
        base = decode_chain_int4.int4_variants()["int4 dependent + join"]
        chosen = q_pipe_int4_variants({"int4 dependent + join": base})
        names = ["gate/up 4 rows 3 stages 2 turns", "down 8 rows 4 groups 4 stages",
                 "q/k/v 4 rows one step 3 stages 2 turns", "head 8 rows 8 groups 3 stages "
                 "4 turns"]
        prefix = "int4 dependent + join + q-pipe "
    else:
        chosen = variants(None, True)
        base = chosen["dependent + join"]
        names = ["gate/up 2 rows one tile 3 stages 4 turns + down 4 rows 2048 ahead 3 "
                 "stages", "head 8 rows one tile 3 stages 4 turns"]
        prefix = "dependent + join + q-pipe "
    want = step(made, hidden, False, base[1], join=True).float()
    for name in names:
        pdl, configs, *_ = chosen[prefix + name]
        step(made, hidden, pdl, configs, join=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step(made, hidden, pdl, configs, join=True)
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            _close(out, want)
