"""decode_chain_cuda.py's ``--int8`` variants whose int8 products with the norm folded
(q/k/v, gate/up, the head) read x as int8 codes in blocks of QBLOCK columns, four
products a dp4a (targets/aoti/kernels/int8_dot4_triton.py), over the int8 chain's base
"dependent + join + attention-o joined 8 splits 4 rows" (o and down unchanged):

    python bench/decode_chain_cuda.py --int8 --rounds 40 --variants "dependent + join +
        attention-o joined 8 splits 4 rows,dependent + join + attention-o joined 8 splits
        4 rows + dot4 q32 gate/up 8 rows,..."

A product's configuration is int8_words_triton's (BLOCK_N, BLOCK_K, warps, AHEAD): x's
quantization is each program's work, so more rows a program share it (the float form's
registers held gate/up at 4 rows; dp4a's hold far fewer).
``python bench/decode_chain_dot4.py`` prints each variant's products' registers and SASS
instructions a weight for sm_90a, without a GPU.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BASE = "dependent + join + attention-o joined 8 splits 4 rows"

QKV, HEAD = (4, 1024, 4, 2048), (8, 1024, 4, 1024)  # the int8 chain's own shapes
# name -> (x's block of columns, {product: int8_words configuration})
CHANGES = {
    "dot4 q32 gate/up 4 rows": (32, {"gate_up": (4, 1024, 4, 0)}),
    "dot4 q32 gate/up 8 rows": (32, {"gate_up": (8, 1024, 4, 0)}),
    "dot4 q32 gate/up 16 rows 8 warps": (32, {"gate_up": (16, 1024, 8, 0)}),
    "dot4 q128 gate/up 16 rows": (128, {"gate_up": (16, 1024, 4, 0)}),
    "dot4 q32 everywhere": (32, {"qkv": (8, 1024, 4, 2048), "gate_up": (8, 1024, 4, 0),
                                 "head": (16, 1024, 4, 1024)}),
    "dot4 q32 everywhere 16 rows": (32, {"qkv": (16, 1024, 8, 2048),
                                         "gate_up": (16, 1024, 8, 0),
                                         "head": (16, 1024, 8, 1024)}),
}


class Dot4Rows:
    """decode_chain_cuda.step's ``configs[product]``: (x, rows, scale, fold, pdl) -> the
    product over x's int8 codes (launch_int8_words with ``x_qblock``)."""

    def __init__(self, config: tuple, qblock: int):
        self.config, self.qblock = config, qblock

    def __repr__(self) -> str:  # the row's "configs" in the bench's JSON
        return f"dot4 q{self.qblock} {self.config}"

    def __call__(self, x, rows, scale, fold, pdl):
        from targets.aoti.kernels.int8_words_triton import launch_int8_words
        return launch_int8_words(x, rows, None, fold.get("norm"), fold.get("residual"),
                                 1e-5, 0.0, fold.get("act", 0), scale, self.config, pdl,
                                 x_qblock=self.qblock)


def dot4_variants(joined: dict) -> dict:
    """decode_chain_cuda.variants()'s entries: BASE (from ``joined``, the attention + o
    variants) with CHANGES' products over x's int8 codes."""
    if BASE not in joined:
        return {}
    pdl, configs, *rest = joined[BASE]
    found = {f"{BASE} + {name}": (pdl, {**configs, **{
        product: Dot4Rows(config, qblock) for product, config in products.items()}}, *rest)
        for name, (qblock, products) in CHANGES.items()}
    if importlib.util.find_spec("triton") is None:  # the head's kernels import Triton
        return found
    from bench.head_argmax_triton import HeadArgmax
    # the library's head ends with its token kernel: over float x, or over x's codes
    gate_up = {"gate_up": Dot4Rows(CHANGES["dot4 q32 gate/up 8 rows"][1]["gate_up"], 32)}
    for name, head in (("head argmax", HeadArgmax(None, True)),
                       ("head argmax x codes", HeadArgmax(None, True, 32))):
        found[f"{BASE} + dot4 q32 gate/up 8 rows + {name}"] = (
            pdl, {**configs, **gate_up, "head": head}, *rest)
    return found


def compiled(product: str, config: tuple, qblock: int):
    """The ``_gdc`` kernel ``config`` launches for ``product`` (the ~1.1B's shape),
    compiled for sm_90a, and the weights a thread holds."""
    from bench.int4_rows_ptx import sm90_compiled
    from bench.int8_cvt_rows import SHAPES
    from targets.aoti.kernels.int8_words_triton import int8_words_kernel_gdc
    n, k, norm, act, res = {**SHAPES, "head": (32000, 2048, True, 0, False)}[product]
    block_n, block_k, warps, ahead = config
    return sm90_compiled(int8_words_kernel_gdc, {"w_ptr": "*i8"}, dict(
        EPS=1e-5, OFFSET=0.0, N=n, K=k, HAS_NORM=norm, ACT=act, HAS_RES=res,
        BLOCK_N=block_n, BLOCK_K=block_k, AHEAD=ahead, HAS_BIAS=False, W_AHEAD=True,
        ROT_ROWS=0, HEAD_D=0, PRMT=True, QBLOCK=qblock), warps), (
        block_n * k * (2 if act else 1) / (32 * warps))


def figures(product: str, config: tuple, qblock: int) -> str:
    """ptxas's registers (and bytes spilled) and SASS instructions a weight held."""
    from bench.int4_rows_ptx import ptxas_report
    from bench.int8_cvt_rows import sass
    kernel, weights = compiled(product, config, qblock)
    count = len(re.findall(r"/\*[0-9a-f]{4}\*/", sass(kernel)))
    registers, spilled = ptxas_report(kernel.asm["ptx"])
    return (f"registers {registers}" + (f" (spills {spilled} B)" if spilled else "")
            + f"  instructions a weight {count / weights:.2f}")


def main() -> None:
    for name, (qblock, products) in CHANGES.items():
        for product, config in products.items():
            print(f"{name:34s} {product:8s} {figures(product, config, qblock)}", flush=True)


if __name__ == "__main__":
    main()
