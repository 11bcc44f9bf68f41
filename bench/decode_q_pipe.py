"""decode_chain_cuda.py's variants whose int8 or int4 products stream their weights
through shared memory: bench/q_pipe_rows.py's kernel (int8 rows with their scales, the
gate, the norm) and bench/q_pipe_int4.py's (int4 rows in groups), each a ``tl.range``
loop with ``num_stages`` whose weight loads Triton turns into cp.async copies, TURNS
blocks of rows a program. Each variant changes one product (or two) of a base chain:
"dependent + join" (``--int8``) or "int4 dependent + join" (``--int4``), and the same
with the layer's attention and o in one launch, as a library now runs them.

    python bench/decode_chain_cuda.py --int8 --rounds 60 --variants "dependent + join,
        dependent + join + q-pipe gate/up 2 rows one tile 3 stages 4 turns,..."
    python bench/decode_chain_cuda.py --int4 --rounds 60 --variants "int4 dependent +
        join,int4 dependent + join + q-pipe gate/up ...,..."      (on the GPU machine)

Without a GPU, ``python bench/decode_q_pipe.py`` compiles each variant's ``_gdc`` kernel
for sm_90a: registers, spills, shared bytes, the cp.async copies in its PTX and whether
every copy comes after the wait, the programs a multiprocessor holds and the weight
bytes they keep in flight (each beside the library's kernel for the product).
``--chain int8`` (or ``int4``) prints a ``--variants`` list instead: a base, then it with
each change (bench/pending/q_pipe_chain.sh).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class QPipeLaunch:
    """A chain configuration that is a launch of its own (decode_chain_cuda.step's
    ``configs[name](x, rows, scale, fold, pdl)``): int8 (or 16-bit) rows through
    q_pipe_rows.py, ``config`` (BLOCK_N, BLOCK_K, warps, AHEAD, STAGES, TURNS)."""

    def __init__(self, config: tuple):
        self.config = config

    def __call__(self, x, weight, scale, fold: dict, pdl: bool):
        from bench.q_pipe_rows import launch_q_pipe_rows
        return launch_q_pipe_rows(x, weight, scale, fold.get("norm"), fold.get("residual"),
                                  fold.get("act", 0), self.config, pdl)

    def __repr__(self) -> str:  # the row's "configs" in the bench's JSON
        return f"q-pipe{self.config}"


class QPipeInt4Launch:
    """The same over int4 rows (``packed``, ``scales``) through q_pipe_int4.py, ``config``
    (BLOCK_N, BLOCK_G, warps, HELD, STAGES, TURNS, SPLIT_X); ``rotary`` (cos, sin, rows,
    head dim) for q/k/v, as decode_chain_int4.Int4Launch's."""

    def __init__(self, config: tuple, rotary: tuple = ()):
        self.config, self.rotary = config, rotary

    def __call__(self, x, packed, scales, fold: dict, pdl: bool):
        from bench.q_pipe_int4 import launch_q_pipe_int4
        cos, sin, rows, dim = self.rotary or (None, None, 0, 0)
        return launch_q_pipe_int4(x, packed, scales, fold.get("norm"), fold.get("residual"),
                                  fold.get("act", 0), self.config, pdl, 1e-5, 0.0, cos, sin,
                                  rows, dim)

    def __repr__(self) -> str:
        return f"q-pipe int4{self.config}"


# name -> {product: (BLOCK_N, BLOCK_K, warps, AHEAD, STAGES, TURNS)}. The int8 chain's
# products now (gemv_config): q/k/v (4, 1024, 4, 2048 ahead: the whole row), o (2, 1024,
# 8, 2048), gate/up (2, 1024, 4, nothing ahead: 2,816 programs of 8 KB), down split in 4
# parts along K (2,048 programs, each its whole part ahead), the head (8, 1024, 4, 1024).
# "one tile": BLOCK_K the whole 2,048-column row; "x once": x read once before the loop,
# only weights copied (its move into the tile's layout then comes before the first copy).
INT8_CHANGES = {
    "nothing changed": {},  # the base again: the spread between two equal graphs
    "gate/up 2 rows one tile 3 stages 2 turns": {"gate_up": (2, 2048, 4, 0, 3, 2)},
    "gate/up 2 rows one tile 3 stages 4 turns": {"gate_up": (2, 2048, 4, 0, 3, 4)},
    "gate/up 2 rows one tile x once 3 stages 2 turns": {
        "gate_up": (2, 2048, 4, 0, 3, 2, True)},
    "gate/up 2 rows one tile 4 stages 4 turns": {"gate_up": (2, 2048, 4, 0, 4, 4)},
    "gate/up 2 rows one tile 3 stages 8 turns": {"gate_up": (2, 2048, 4, 0, 3, 8)},
    "gate/up 1 row one tile 4 stages 4 turns": {"gate_up": (1, 2048, 4, 0, 4, 4)},
    "gate/up 4 rows one tile 8 warps 3 stages 2 turns": {"gate_up": (4, 2048, 8, 0, 3, 2)},
    "gate/up 2 rows 1024-column tiles 4 stages 4 turns": {"gate_up": (2, 1024, 4, 0, 4, 4)},
    "down 4 rows 2048 ahead 3 stages": {"down": (4, 1024, 4, 2048, 3, 1)},
    "down 4 rows 2048 ahead 512-column tiles 4 stages": {"down": (4, 512, 4, 2048, 4, 1)},
    "down 4 rows 1024-column tiles 4 stages": {"down": (4, 1024, 4, 0, 4, 1)},
    "down 2 rows 1024-column tiles 5 stages": {"down": (2, 1024, 4, 0, 5, 1)},
    "q/k/v 4 rows one tile 3 stages 2 turns": {"qkv": (4, 2048, 4, 0, 3, 2)},
    # the first block's whole row ahead of the wait (as the library's q/k/v), the rest
    # streamed: its sums come after the loop, so the copies go out right after the wait
    # (a loop of one tile is not pipelined: no cp.async, so no 2-turn one-tile forms)
    "q/k/v 4 rows first block ahead 3 stages 3 turns": {"qkv": (4, 2048, 4, 2048, 3, 3)},
    "gate/up 2 rows first block ahead 3 stages 4 turns": {"gate_up": (2, 2048, 4, 2048, 3, 4)},
    "head 4 rows first block ahead 3 stages 4 turns": {"head": (4, 2048, 4, 2048, 3, 4)},
    "head 8 rows one tile 3 stages 4 turns": {"head": (8, 2048, 4, 0, 3, 4)},
    "head 4 rows one tile 3 stages 8 turns": {"head": (4, 2048, 4, 0, 3, 8)},
    "head 8 rows one tile x once 3 stages 4 turns": {"head": (8, 2048, 4, 0, 3, 4, True)},
    "gate/up 2 rows one tile 3 stages 4 turns + down 4 rows 2048 ahead 3 stages": {
        "gate_up": (2, 2048, 4, 0, 3, 4), "down": (4, 1024, 4, 2048, 3, 1)},
}
# name -> {product: (BLOCK_N, BLOCK_G, warps, HELD, STAGES, TURNS, SPLIT_X)}. The int4
# chain's products now (int4_config): q/k/v, o, gate/up (4, 8, 4): two steps a row, both
# held before the wait (640, 512, 1,408 programs); down (4, 16, 8): three steps (512); the
# head (8, 4, 4): four steps (4,000). "one step": BLOCK_G the row's 16 groups. Dropped
# offline: gate/up with its first step held (166 registers a thread), the head one step
# a tile (8 rows: 16 bytes spilled).
INT4_CHANGES = {
    "nothing changed": {},
    "gate/up 4 rows 3 stages 2 turns": {"gate_up": (4, 8, 4, 0, 3, 2, True)},
    "gate/up 4 rows 3 stages 4 turns": {"gate_up": (4, 8, 4, 0, 3, 4, True)},
    "gate/up 4 rows 4 stages 4 turns": {"gate_up": (4, 8, 4, 0, 4, 4, True)},
    "gate/up 2 rows one step 3 stages 4 turns": {"gate_up": (2, 16, 4, 0, 3, 4, True)},
    "down 4 rows 8 groups 4 stages": {"down": (4, 8, 4, 0, 4, 1, False)},
    "down 8 rows 4 groups 4 stages": {"down": (8, 4, 4, 0, 4, 1, False)},
    "down 4 rows 16 groups 8 warps held 3 stages": {"down": (4, 16, 8, 1, 3, 1, False)},
    "q/k/v 4 rows one step 3 stages 2 turns": {"qkv": (4, 16, 4, 0, 3, 2, False)},
    "o 4 rows one step 3 stages 2 turns": {"o": (4, 16, 4, 0, 3, 2, False)},
    "head 8 rows 8 groups 3 stages 4 turns": {"head": (8, 8, 4, 0, 3, 4, False)},
    "head 8 rows held 4 stages 2 turns": {"head": (8, 4, 4, 1, 4, 2, False)},
    # the whole share of a program in shared memory at once (every step's copy issued
    # after the wait), or more steps in flight
    "gate/up 4 rows 5 stages 2 turns": {"gate_up": (4, 8, 4, 0, 5, 2, True)},
    "head 8 rows 8 groups 4 stages 4 turns": {"head": (8, 8, 4, 0, 4, 4, False)},
    # the first block's whole row held (as the library's), the rest streamed (a loop of
    # one step is not pipelined: no one-step forms)
    "q/k/v 4 rows first row held 3 stages 2 turns": {"qkv": (4, 8, 4, 2, 3, 2, False)},
    "gate/up 4 rows first row held 3 stages 2 turns": {"gate_up": (4, 8, 4, 2, 3, 2, True)},
    "down 4 rows first row held 8 warps 3 stages 2 turns": {
        "down": (4, 16, 8, 2, 3, 2, False)},
    "head 8 rows first row held 8 groups 3 stages 2 turns": {
        "head": (8, 8, 4, 2, 3, 2, False)},
}


def q_pipe_variants(bases: dict) -> dict:
    """decode_chain_cuda.variants()'s ``--int8`` entries: for each base (name -> its
    variant tuple), the base with INT8_CHANGES' products as QPipeLaunch."""
    return {f"{base} + q-pipe {name}": (pdl, {**configs, **{
        product: QPipeLaunch(c) for product, c in changes.items()}}, *rest)
        for base, (pdl, configs, *rest) in bases.items()
        for name, changes in INT8_CHANGES.items()}


# the --int4 chain's bases: as before the join of the attention and o, and as a library
# runs them now
INT4_BASES = ("int4 dependent + join", "int4 dependent + join + attention-o joined 4 splits "
              "4 rows")


def q_pipe_int4_variants(bases: dict) -> dict:
    """The ``--int4`` entries: each base with INT4_CHANGES' products as QPipeInt4Launch
    (q/k/v keeps its base launch's rotary embedding)."""
    def launch(configs, product, config):
        return QPipeInt4Launch(config, getattr(configs.get(product), "rotary", ()))
    return {f"{base} + q-pipe {name}": (pdl, {**configs, **{
        product: launch(configs, product, c) for product, c in changes.items()}}, *rest)
        for base, (pdl, configs, *rest) in bases.items()
        for name, changes in INT4_CHANGES.items()}


# the ~1.1B's products: (rows a program computes, columns, norm, gated, residual, rotary
# rows in the int4 chain)
SHAPES = {"qkv": (2560, 2048, True, 0, False, 2304), "o": (2048, 2048, False, 0, True, 0),
          "gate_up": (5632, 2048, True, 1, False, 0), "down": (2048, 5632, False, 0, True, 0),
          "head": (32000, 2048, True, 0, False, 0)}


def compiled(product: str, config: tuple, int4: bool) -> dict:
    """The ``_gdc`` kernel of ``config`` at ``product``'s shape compiled for sm_90a here:
    registers, spilled bytes, shared bytes, cp.async copies in the PTX (and their sizes),
    whether all come after the wait."""
    from bench.int4_rows_ptx import ptxas_report, sm90_compiled
    n, k, norm, act, res, rotated = SHAPES[product]
    values = dict(EPS=1e-5, OFFSET=0.0, N=n, K=k, HAS_NORM=norm, ACT=act, HAS_RES=res,
                  BLOCK_N=config[0], STAGES=config[4], TURNS=config[5])
    if int4:
        from bench.q_pipe_int4 import q_pipe_int4_kernel_gdc as kernel
        values.update(GROUP=128, BLOCK_G=config[1], HELD=config[3], SPLIT_X=config[6],
                      ROT_ROWS=rotated, HEAD_D=64 if rotated else 0,
                      ROW_G=1 << (k // 128 - 1).bit_length())
        kinds = {"w_ptr": "*u8"}
    else:
        from bench.q_pipe_rows import q_pipe_rows_kernel_gdc as kernel
        values.update(BLOCK_K=config[1], AHEAD=config[3], HAS_SCALE=True, ROT_ROWS=0,
                      HEAD_D=0, X_ONCE=bool((*config[6:], False)[0]))
        kinds = {"w_ptr": "*i8"}
    found = sm90_compiled(kernel, kinds, values, config[2])
    ptx = found.asm["ptx"]
    copies = [m.start() for m in re.finditer(r"cp\.async\.c[ag]\.shared", ptx)]
    sizes = re.findall(r"cp\.async\.c[ag]\.shared\.global[^\[]*\[[^\]]*\],\s*\[[^\]]*\],"
                       r"\s*(0x\w+|\d+)", ptx)
    wait = ptx.find("griddepcontrol.wait")
    registers, spilled = ptxas_report(ptx)
    # barriers between the wait and the first copy: each waits for what was read before
    barriers = ptx[wait:min(copies)].count("bar.sync") if copies else -1
    # a step's weight bytes (int4: 64 a group a row, and its 4-byte (scale, offset))
    step = config[0] * config[1] * (68 if int4 else 1) * (2 if act else 1)
    if int4:  # before the wait: a step, or the first block's whole row
        held = (0, step, config[0] * k // 128 * 68 * (2 if act else 1))[config[3]]
    else:
        held = config[0] * min(config[3], k) * (2 if act else 1)
    return {"registers": registers, "spilled": spilled, "shared": found.metadata.shared,
            "copies": len(copies), "sizes": sorted({int(s, 0) for s in sizes}),
            "after_wait": bool(copies) and 0 <= wait < min(copies),
            "grid": -(-n // (config[0] * config[5])), "warps": config[2],
            "in_flight": (config[4] - 1) * step, "held": held, "barriers": barriers}


def library_compiled(product: str, int4: bool) -> dict:
    """compiled()'s figures for the kernel a library runs for ``product`` now (int8:
    gemv_config's on 132 SMs, int4: int4_config's): ``in_flight`` a program's weight
    bytes loaded before its first sum (int8's one-block kernel: all of them, unrolled)."""
    from bench.int4_rows_ptx import ptxas_report, sm90_compiled
    n, k, norm, act, res, _ = SHAPES[product]
    if int4:
        from bench.decode_chain_int4 import compiled as int4_compiled
        from targets.aoti.kernels.int4_triton import int4_config
        block_n, block_g = int4_config(n, k, 128, bool(act))[:2]
        found = int4_compiled(product, None)
        steps = min(2, -(-k // (128 * block_g)))  # two steps held before the wait
        return {**found, "spilled": "-",
                "in_flight": steps * block_n * block_g * 68 * (2 if act else 1)}
    from targets.aoti.kernels import split_gemv_triton, triton_kernels
    config = triton_kernels.gemv_config(n, k, bool(act), True, 1, 132, product == "down",
                                        False)
    block_n, block_k, warps, ahead, *rest = config
    values = dict(N=n, K=k, HAS_BIAS=False, HAS_RES=res, HAS_SCALE=True, BLOCK_N=block_n,
                  BLOCK_K=block_k, AHEAD=ahead, W_AHEAD=True)
    if rest and rest[2]:  # split along K: a program's part of each row
        split = rest[2]
        values.update(SPLIT=split, PART=-(-k // split))
        kernel, kinds = split_gemv_triton.split_gemv_kernel_gdc, {
            "w_ptr": "*i8", "part_ptr": "*fp32", "counts_ptr": "*i32"}
        grid, share = -(-n // block_n) * split, block_n * -(-k // split)
    else:
        values.update(EPS=1e-5, OFFSET=0.0, HAS_NORM=norm, ACT=act, TILE_X=False,
                      ROT_ROWS=0, HEAD_D=0)
        kernel, kinds = triton_kernels.row_gemv_kernel_gdc, {"w_ptr": "*i8"}
        grid, share = -(-n // block_n), block_n * k * (2 if act else 1)
    found = sm90_compiled(kernel, kinds, values, warps)
    registers, spilled = ptxas_report(found.asm["ptx"])
    return {"registers": registers, "spilled": spilled, "shared": found.metadata.shared,
            "grid": grid, "warps": warps, "in_flight": share}


def per_sm(found: dict) -> str:
    """Programs a multiprocessor holds (decode_chain_int4.resident), the grid's waves on
    132, and the weight bytes in flight a multiprocessor at once (the pipeline's, for
    compiled(): STAGES - 1 steps a program, what it held before its wait aside)."""
    from bench.decode_chain_int4 import resident
    fits = resident(found["registers"], found["warps"], found["shared"])
    busy = min(fits, -(-found["grid"] // 132))
    return (f"{fits:2d} a SM, grid {found['grid']:5d} = {found['grid'] / (fits * 132):.2f} "
            f"waves, {busy * found['in_flight'] / 1024:5.1f} KB in flight a SM")


def chain_names(int4: bool, base: str | None = None, only: tuple = ()) -> list[str]:
    """The variant names of one ``--variants`` list: ``base`` (by default the first of the
    width's bases) first, then it with each change (those in ``only``, else all)."""
    base = base or (INT4_BASES[0] if int4 else "dependent + join")
    changes = INT4_CHANGES if int4 else INT8_CHANGES
    return [base] + [f"{base} + q-pipe {name}" for name in changes
                     if not only or name in only]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chain", choices=("int8", "int4"),
                        help="print a --variants list for decode_chain_cuda.py instead")
    parser.add_argument("--base", help="with --chain: the base variant (default: the "
                                       "width's first)")
    parser.add_argument("--only", default="", help="with --chain: these changes only, "
                                                   "';'-separated")
    args = parser.parse_args()
    if args.chain:
        only = tuple(name for name in args.only.split(";") if name)
        print(",".join(chain_names(args.chain == "int4", args.base, only)))
        return
    for int4, changes in ((False, INT8_CHANGES), (True, INT4_CHANGES)):
        width = "int4" if int4 else "int8"
        for product in SHAPES:
            got = library_compiled(product, int4)
            print(f"{width} library {product:8s} registers {got['registers']:3d}, spilled "
                  f"{got['spilled']}, shared {got['shared']:6d} B; {per_sm(got)}", flush=True)
        for name, products in changes.items():
            for product, config in products.items():
                got = compiled(product, config, int4)
                print(f"{width} {name:58s} {str(config):30s} "
                      f"registers {got['registers']:3d}, spilled {got['spilled']}, shared "
                      f"{got['shared']:6d} B, cp.async {got['copies']:3d} of "
                      f"{got['sizes']} B{', all after the wait' if got['after_wait'] else ''}"
                      f" ({got['barriers']} barriers before the first); {got['held']} B "
                      f"held; {per_sm(got)}", flush=True)


if __name__ == "__main__":
    main()
