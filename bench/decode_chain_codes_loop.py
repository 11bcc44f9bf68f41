"""decode_chain_cuda.py's ``--int8`` variants whose q/k/v and gate/up run as a row loop
over x's int8 codes (targets/aoti/kernels/int8_codes_loop_triton.py: x quantized once a
program, blocks of rows in turns, the next block's rows in flight while one is summed),
over the int8 chain's base "dependent + join + attention-o joined 8 splits 4 rows":

    python bench/decode_chain_cuda.py --int8 --rounds 40 --variants "<base>,<base> +
        dot4 q32 gate/up 8 rows,<base> + codes loop gate/up 4 rows 4 a SM,..."

A configuration is (BLOCK_N, programs a multiprocessor, warps): the grid is that many
programs on each of the GPU's multiprocessors (one wave), each taking its blocks in turn.
``python bench/decode_chain_codes_loop.py`` prints registers and SASS instructions for
sm_90a without a GPU.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BASE = "dependent + join + attention-o joined 8 splits 4 rows"
QBLOCK = 32
# name -> {product: (BLOCK_N, programs a multiprocessor, warps)}
CHANGES = {
    "codes loop gate/up 4 rows 4 a SM": {"gate_up": (4, 4, 4)},
    "codes loop gate/up 2 rows 8 a SM": {"gate_up": (2, 8, 4)},
    "codes loop gate/up 8 rows 2 a SM": {"gate_up": (8, 2, 4)},
    "codes loop gate/up 4 rows 4 a SM + q/k/v 4 rows 4 a SM": {"gate_up": (4, 4, 4),
                                                                "qkv": (4, 4, 4)},
}


class CodesLoop:
    """decode_chain_cuda.step's ``configs[product]``: (x, rows, scale, fold, pdl) -> the
    product as int8_codes_loop_triton's row loop at ``config``."""

    def __init__(self, config: tuple):
        self.config = config

    def __repr__(self) -> str:  # the row's "configs" in the bench's JSON
        return f"codes loop q{QBLOCK} {self.config}"

    def __call__(self, x, rows, scale, fold, pdl):
        import torch

        from targets.aoti.kernels.int8_codes_loop_triton import launch_int8_codes_loop
        block_n, per_sm, warps = self.config
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        return launch_int8_codes_loop(x, rows, None, fold.get("norm"), fold.get("residual"),
                                      1e-5, 0.0, fold.get("act", 0), scale, QBLOCK,
                                      (block_n, per_sm * sms, warps), pdl)


def codes_loop_variants(joined: dict) -> dict:
    """decode_chain_cuda.variants()'s entries: BASE (from ``joined``, the attention + o
    variants) with CHANGES' products as row loops over x's int8 codes."""
    if BASE not in joined:
        return {}
    pdl, configs, *rest = joined[BASE]
    return {f"{BASE} + {name}": (pdl, {**configs, **{
        product: CodesLoop(config) for product, config in products.items()}}, *rest)
        for name, products in CHANGES.items()}


def main() -> None:
    from bench.int4_rows_ptx import ptxas_report, sm90_compiled
    from bench.int8_cvt_rows import SHAPES, sass
    from targets.aoti.kernels.int8_codes_loop_triton import int8_codes_loop_kernel_gdc
    seen = set()
    for products in CHANGES.values():
        for product, (block_n, per_sm, warps) in products.items():
            if (product, block_n, warps) in seen:
                continue
            seen.add((product, block_n, warps))
            n, k, norm, act, res = SHAPES[product]
            compiled = sm90_compiled(int8_codes_loop_kernel_gdc, {"w_ptr": "*i8"}, dict(
                EPS=1e-5, OFFSET=0.0, N=n, K=k, HAS_BIAS=False, HAS_NORM=norm, ACT=act,
                HAS_RES=res, BLOCK_N=block_n, WIDTH=k // 4, TURNS=3, W_AHEAD=True,
                ROT_ROWS=0, HEAD_D=0, PTX=True, QBLOCK=QBLOCK), warps)
            count = len(re.findall(r"/\*[0-9a-f]{4}\*/", sass(compiled)))
            weights = block_n * k * (2 if act else 1) / (32 * warps)
            registers, spills = ptxas_report(compiled.asm["ptx"])[:2]
            print(f"{product:8s} {block_n} rows {warps} warps: registers {registers}, "
                  f"spills {spills}, {count} instructions ({count / weights:.2f} a weight "
                  f"of one block, x's quantization included)", flush=True)


if __name__ == "__main__":
    main()
