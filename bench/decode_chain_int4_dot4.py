"""decode_chain_cuda.py's ``--int4`` variants whose int4 products with the norm folded
(q/k/v, gate/up, the head) read x as int8 codes in blocks of QBLOCK columns: a word's
eight nibbles masked in place, four against x's four codes a dp4a
(targets/aoti/kernels/int4_triton.py's ``x_qblock``), over the int4 chain's base
"int4 dependent + join + attention-o joined 4 splits 4 rows" (o and down unchanged):

    python bench/decode_chain_cuda.py --int4 --rounds 40 --variants "int4 dependent +
        join + attention-o joined 4 splits 4 rows,int4 dependent + join + attention-o
        joined 4 splits 4 rows + dot4 q32 gate/up,..."

A product's configuration is int4_config's (BLOCK_N, BLOCK_G, warps[, SPLIT_X]), None
for the product's own: x's quantization is each program's work, so more rows a program
share it. ``python bench/decode_chain_int4_dot4.py`` prints each product's registers,
spills and SASS instructions a weight for sm_90a, the float form's at the same
configuration, then the dot4 one's, without a GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BASE = "int4 dependent + join + attention-o joined 4 splits 4 rows"

# name -> (x's block of columns, {product: configuration, None for int4_config's}).
# More rows a program share x's quantization (its instructions and barriers): SASS
# instructions a weight fall with rows faster than in the float form, and dp4a's sums
# hold fewer registers (gate/up at 16 rows 8 warps 102, a multiprocessor 2 programs)
CHANGES = {
    "dot4 q32 gate/up": (32, {"gate_up": None}),
    "dot4 q32 gate/up 8 rows 8 warps": (32, {"gate_up": (8, 8, 8)}),
    "dot4 q32 q/k/v gate/up head 8-16 rows": (
        32, {"qkv": (8, 4, 4), "gate_up": (8, 8, 8), "head": (16, 8, 8)}),
    "dot4 q32 q/k/v gate/up head 16 rows 8 warps": (
        32, {"qkv": (16, 8, 8), "gate_up": (16, 8, 8), "head": (16, 8, 8)}),
    # the control: the float form at the same configurations (x_qblock 0)
    "float q/k/v gate/up head 8-16 rows": (
        0, {"qkv": (8, 4, 4), "gate_up": (8, 8, 8), "head": (16, 8, 8)}),
}


class Dot4Launch:
    """decode_chain_cuda.step's ``configs[product]``: (x, packed, scales, fold, pdl) ->
    the product over x's int8 codes (launch_int4_row_gemv with ``x_qblock``);
    ``rotary``: q/k/v's (cos, sin, rows, head dim), decode_chain_int4.Int4Launch's."""

    def __init__(self, config: tuple | None, qblock: int, rotary: tuple = ()):
        self.config, self.qblock, self.rotary = config, qblock, rotary

    def __repr__(self) -> str:  # the row's "configs" in the bench's JSON
        return f"int4 {f'dot4 q{self.qblock}' if self.qblock else 'float'}{self.config or ''}"

    def __call__(self, x, packed, scales, fold: dict, pdl: bool):
        from targets.aoti.kernels.int4_triton import launch_int4_row_gemv
        cos, sin, rows, dim = self.rotary or (None, None, 0, 0)
        return launch_int4_row_gemv(x, packed, scales, None, fold.get("norm"),
                                    fold.get("residual"), 1e-5, 0.0, fold.get("act", 0),
                                    self.config, pdl, cos, sin, rows, dim,
                                    x_qblock=self.qblock)


def int4_dot4_variants(int4_chosen: dict) -> dict:
    """decode_chain_int4.int4_variants()'s entries: BASE (decode_attention_o's over
    ``int4_chosen``) with CHANGES' products over x's int8 codes, q/k/v keeping its
    rotary fold."""
    from bench.decode_attention_o import attention_o_int4_variants
    if "int4 dependent + join" not in int4_chosen:
        return {}
    pdl, configs, *rest = attention_o_int4_variants(int4_chosen)[BASE]

    def launch(product, config, qblock):
        return Dot4Launch(config, qblock, getattr(configs[product], "rotary", ()))
    return {f"{BASE} + {name}": (pdl, {**configs, **{
        product: launch(product, config, qblock) for product, config in products.items()}},
        *rest) for name, (qblock, products) in CHANGES.items()}


# the chain's products by decode_kernels_cuda.SHAPES' names
NAMES = {"qkv": "qkv+norm", "gate_up": "gate_up+norm+silu", "head": "lm_head+norm"}


def compiled(product: str, config: tuple | None, qblock: int):
    """(the ``_gdc`` kernel for ``product`` compiled for sm_90a, weights a thread)."""
    from bench.decode_kernels_cuda import SHAPES
    from bench.int4_rows_ptx import ROTATED, sm90_compiled
    from targets.aoti.kernels.int4_triton import (int4_config, int4_row_gemv_kernel_gdc,
                                                  rotary_block)
    name, n, k, norm, act, res = next(s for s in SHAPES if s[0] == NAMES[product])
    block_n, block_g, warps, *split = config or int4_config(n, k, 128, bool(act))
    rotated, head = ROTATED.get(name, (0, 0))
    block_n = rotary_block(block_n, rotated)
    values = dict(EPS=1e-5, OFFSET=0.0, N=n, K=k, GROUP=128, HAS_BIAS=False,
                  HAS_NORM=norm, ACT=act, HAS_RES=res, BLOCK_N=block_n, BLOCK_G=block_g,
                  ROT_ROWS=rotated, HEAD_D=head, SPLIT_X=bool((*split, act)[0]),
                  QBLOCK=qblock, PTX=True)
    kernel = sm90_compiled(int4_row_gemv_kernel_gdc, {"w_ptr": "*u8"}, values, warps)
    return kernel, block_n * k * (2 if act else 1) / (32 * warps)


def figures(product: str, config: tuple | None, qblock: int) -> tuple:
    """(registers, bytes spilled, SASS instructions a weight) of compiled()'s kernel."""
    import re

    from bench.int4_rows_ptx import ptxas_report
    from bench.int8_cvt_rows import sass
    kernel, weights = compiled(product, config, qblock)
    count = len(re.findall(r"/\*[0-9a-f]{4}\*/", sass(kernel)))
    return (*ptxas_report(kernel.asm["ptx"]), count / weights)


def main() -> None:
    for name, (qblock, products) in CHANGES.items():
        if not qblock:  # the control: the float form's figures are printed beside
            continue
        print(name, flush=True)
        for product, config in products.items():
            (r0, s0, i0), (r1, s1, i1) = (figures(product, config, q) for q in (0, qblock))
            print(f"  {product:8s} {str(config or 'default'):10s} registers {r0} -> {r1}, "
                  f"spilled {s0} -> {s1}, SASS instructions a weight {i0:.2f} -> {i1:.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
