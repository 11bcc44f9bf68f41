"""decode_chain_cuda.py's variants that run a product as the row loop
(targets/aoti/kernels/row_loop_triton.py): a grid of few programs, each taking TURNS
blocks of rows and loading the next block's first columns while it sums the current one;
and the one-block-a-program kernel with other shapes (a gated product's whole row ahead).

A product's configuration is launch_row_gemv's (BLOCK_N, BLOCK_K, warps, AHEAD,
TILE_X, TURNS); a variant changes one product or several from "dependent + join" (what
the built library runs: gate/up's row loop of 2 rows and, on 132 multiprocessors, 5 turns),
and is named by what it changes:

    python bench/decode_chain_cuda.py --rounds 20 --variants "dependent + join,dependent + join + row loop
        gate/up 1 row 11 turns,..."

With ``--int8`` (the products over int8 rows, their scales a row: the row loop's
HAS_SCALE) the "int8 row loop ..." variants are int8-shaped ones (INT8_CHANGES);
``python bench/decode_chain_split.py`` prints their registers without a GPU.

A grid's programs: ceil(blocks / TURNS); the ~1.1B's gate/up has 5,632 rows, down and
o 2,048, q/k/v 2,560 (the H200 has 132 multiprocessors).
"""

from __future__ import annotations

# with --int8: int8 rows as row loops, 1,024 columns a tile (16-byte loads at 4 warps
# and 2 rows); int8 rows wait on memory, so the next block's bytes in flight are the
# lever. A row of int8 holds twice the columns of fp16 in the same registers: down's
# 5,632 ahead fit in 4,096 + a loop, gate/up's 2,048 at 4 rows
INT8_CHANGES = {
    **{f"int8 row loop gate/up 2 rows {t} turns": {"gate_up": (2, 1024, 4, 2048, False, t)}
       for t in (4, 5, 6)},
    "int8 row loop gate/up 1 row 5 turns": {"gate_up": (1, 2048, 4, 2048, False, 5)},
    "int8 row loop gate/up 4 rows 3 turns": {"gate_up": (4, 1024, 4, 2048, False, 3)},
    "int8 row loop gate/up 4 rows 8 warps 4 turns": {"gate_up": (4, 1024, 8, 2048, False, 4)},
    "int8 row loop down 2 rows 4096 ahead 2 turns": {"down": (2, 1024, 4, 4096, False, 2)},
    "int8 row loop down 2 rows 2048 ahead 2 turns": {"down": (2, 1024, 4, 2048, False, 2)},
    "int8 row loop down 1 row 4096 ahead 4 turns": {"down": (1, 1024, 4, 4096, False, 4)},
    "int8 row loop o 2 rows 2 turns": {"o": (2, 1024, 4, 2048, False, 2)},
    "int8 row loop q/k/v 2 rows 2 turns": {"qkv": (2, 1024, 4, 2048, False, 2)},
    "int8 row loop everywhere": {
        "qkv": (2, 1024, 4, 2048, False, 2), "o": (2, 1024, 4, 2048, False, 2),
        "gate_up": (2, 1024, 4, 2048, False, 5), "down": (2, 1024, 4, 4096, False, 2)},
}

# name -> {product: configuration}; products not named keep "dependent + join"'s
CHANGES = {
    "nothing changed": {},  # the baseline again: the spread between two equal graphs
    # gate/up as one block a program, as before the row loop was chosen for it
    "gate/up one block a program": {"gate_up": (8, 256, 4, 0)},
    # the one-block-a-program kernel: a gated row's gate and up loaded whole ahead
    "gate/up 1 row whole ahead": {"gate_up": (1, 1024, 4, 2048)},
    "gate/up 2 rows whole ahead": {"gate_up": (2, 512, 4, 2048)},
    "down 4 rows 4096 ahead": {"down": (4, 512, 4, 4096)},
    # row loops
    "row loop gate/up 1 row 5 turns": {"gate_up": (1, 1024, 4, 2048, False, 5)},
    "row loop gate/up 1 row 11 turns": {"gate_up": (1, 1024, 4, 2048, False, 11)},
    "row loop gate/up 1 row 22 turns": {"gate_up": (1, 1024, 4, 2048, False, 22)},
    "row loop gate/up 2 rows 6 turns": {"gate_up": (2, 512, 4, 2048, False, 6)},
    "row loop gate/up 2 rows 11 turns": {"gate_up": (2, 512, 4, 2048, False, 11)},
    "row loop gate/up 2 rows 8 warps 11 turns": {"gate_up": (2, 512, 8, 2048, False, 11)},
    "row loop gate/up 4 rows 3 turns": {"gate_up": (4, 512, 4, 2048, False, 3)},
    **{f"row loop gate/up 1 row {t} turns": {"gate_up": (1, 1024, 4, 2048, False, t)}
       for t in (3, 4, 6, 8)},
    "row loop gate/up 1 row 2 warps 5 turns": {"gate_up": (1, 1024, 2, 2048, False, 5)},
    "row loop gate/up 1 row 2 warps 10 turns": {"gate_up": (1, 1024, 2, 2048, False, 10)},
    "row loop gate/up 1 row 8 warps 5 turns": {"gate_up": (1, 1024, 8, 2048, False, 5)},
    **{f"row loop gate/up 2 rows {t} turns": {"gate_up": (2, 512, 4, 2048, False, t)}
       for t in (3, 4, 5)},
    **{f"row loop gate/up 1 row 5 turns + down {name}": {
        "gate_up": (1, 1024, 4, 2048, False, 5), "down": down}
       for name, down in (("4 rows 1024 ahead", (4, 512, 4, 1024)),
                          ("2 rows 2048 ahead", (2, 512, 4, 2048)),
                          ("8 rows 8 warps 2048 ahead", (8, 512, 8, 2048)))},
    "row loop down 2 rows 2 turns": {"down": (2, 512, 4, 2048, False, 2)},
    "row loop down 2 rows 4 turns": {"down": (2, 512, 4, 2048, False, 4)},
    "row loop down 1 row 4096 ahead 4 turns": {"down": (1, 512, 4, 4096, False, 4)},
    "row loop down 4 rows 8 warps 4096 ahead 2 turns": {"down": (4, 512, 8, 4096, False, 2)},
    # o before the row loop's gate/up: fewer, wider programs, or more warps
    "o 4 rows 8 warps": {"o": (4, 512, 8, 2048)},
    "o 2 rows 4 warps": {"o": (2, 512, 4, 2048)},
    "row loop o 2 rows 2 turns": {"o": (2, 512, 4, 2048, False, 2)},
    "row loop o 1 row 4 turns": {"o": (1, 1024, 4, 2048, False, 4)},
    "row loop q/k/v 2 rows 3 turns": {"qkv": (2, 512, 4, 2048, False, 3)},
    "row loop q/k/v 4 rows 2 turns": {"qkv": (4, 512, 4, 2048, False, 2)},
    "row loop gate/up 1 row 11 turns + down 2 rows 2 turns": {
        "gate_up": (1, 1024, 4, 2048, False, 11), "down": (2, 512, 4, 2048, False, 2)},
    "row loop everywhere": {
        "qkv": (2, 512, 4, 2048, False, 3), "o": (2, 512, 4, 2048, False, 2),
        "gate_up": (1, 1024, 4, 2048, False, 11), "down": (2, 512, 4, 2048, False, 2)},
    **INT8_CHANGES,
}


def row_loop_variants(default: dict) -> dict:
    """decode_chain_cuda.variants()'s entries: "dependent + join" with CHANGES' products."""
    return {f"dependent + join + {name}": (True, {**default, **changes}, None, True)
            for name, changes in CHANGES.items()}
