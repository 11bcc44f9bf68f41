"""decode_chain_cuda.py's variants whose down (or q/k/v) streams its weights through shared
memory: targets/aoti/kernels/pipe_gemv_triton.py's kernel (the column loop a ``tl.range``
with ``num_stages``, its weight loads cp.async copies STAGES - 1 tiles ahead of the sums)
in configurations the library does not pick (other stages, rows, tiles, turns, q/k/v).
A built library pipelines down-like rows by gemv_config's rule; the chain's "dependent +
join" is that choice, "dependent + join + down unrolled" the one-block kernel before it.

    python bench/decode_chain_cuda.py --rounds 30 --variants "dependent + join,
        dependent + join + pipe down 4 rows 4 stages,..."      (on the GPU machine)

Without a GPU, ``python bench/decode_pipe_gemv.py`` compiles each variant's ``_gdc`` kernel
for sm_90a and prints registers, shared memory, the cp.async copies in its PTX and
whether every copy comes after the wait.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from targets.aoti.kernels.pipe_gemv_triton import (launch_pipe_gemv,  # noqa: E402
                                                   pipe_gemv_kernel_gdc)


class PipeLaunch:
    """A chain configuration that is a launch of its own (decode_chain_cuda.step's
    ``configs[name](x, rows, scale, fold, pdl)``): the pipelined product."""

    def __init__(self, config: tuple):
        self.config = config

    def __call__(self, x, weight, scale, fold: dict, pdl: bool) -> torch.Tensor:
        if scale is not None or fold.get("act"):
            raise ValueError("a pipelined product takes 16-bit rows and no gate")
        return launch_pipe_gemv(x, weight, fold.get("norm"), fold.get("residual"),
                                self.config, pdl)

    def __repr__(self) -> str:  # the row's "configs" in the bench's JSON
        return f"pipe{self.config}"


# In the 22-layer chain: down with 4 rows, 2,048 columns ahead and 3 or 4 stages ran
# 0.979-0.986 of "dependent + join" (down's own time unchanged, the step's time between
# kernels shorter); fewer columns ahead, more turns, narrower tiles and q/k/v lost.
# name -> {product: (BLOCK_N, BLOCK_K, warps, AHEAD, STAGES, TURNS)}. down: 2,048 rows of
# 5,632 columns (the library: 4 rows, 4 warps, 2,048 ahead, 512-column tiles, 512
# programs); q/k/v: 2,560 rows of 2,048 (the library holds the whole row ahead)
CHANGES = {
    "pipe down 4 rows 3 stages": {"down": (4, 512, 4, 2048, 3, 1)},
    "pipe down 4 rows 4 stages": {"down": (4, 512, 4, 2048, 4, 1)},
    "pipe down 4 rows 6 stages": {"down": (4, 512, 4, 2048, 6, 1)},
    "pipe down 4 rows 1024 ahead 6 stages": {"down": (4, 512, 4, 1024, 6, 1)},
    "pipe down 4 rows 1024 ahead 4 stages": {"down": (4, 512, 4, 1024, 4, 1)},
    "pipe down 4 rows 256-column tiles 1024 ahead 8 stages": {
        "down": (4, 256, 4, 1024, 8, 1)},
    "pipe down 4 rows 8 warps 4 stages": {"down": (4, 512, 8, 2048, 4, 1)},
    "pipe down 2 rows 4 stages": {"down": (2, 512, 4, 2048, 4, 1)},
    "pipe down 8 rows 8 warps 4 stages": {"down": (8, 512, 8, 2048, 4, 1)},
    "pipe down 4 rows 2 turns 6 stages": {"down": (4, 512, 4, 2048, 6, 2)},
    "pipe down 4 rows 1024-column tiles 2 turns 4 stages": {
        "down": (4, 1024, 4, 2048, 4, 2)},
    "pipe q/k/v 4 rows 1024 ahead 3 stages": {"qkv": (4, 512, 4, 1024, 3, 1)},
    "pipe q/k/v 4 rows 1024 ahead 2 turns 4 stages": {"qkv": (4, 512, 4, 1024, 4, 2)},
}


def pipe_variants(default: dict) -> dict:
    """decode_chain_cuda.variants()'s entries: "dependent + join" with CHANGES' products,
    and with every product in the one-block kernel (no STAGES: down as before the rule)."""
    unrolled = {name: config[:4] if len(config) > 7 else config
                for name, config in default.items()}
    return {"dependent + join + down unrolled": (True, unrolled, None, True),
            **{f"dependent + join + {name}": (True, {**default, **{
                product: PipeLaunch(c) for product, c in changes.items()}}, None, True)
               for name, changes in CHANGES.items()}}


# (rows, columns, norm, residual) of the ~1.1B's products
SHAPES = {"qkv": (2560, 2048, True, False), "down": (2048, 5632, False, True)}


def compiled(product: str, config: tuple):
    """The ``_gdc`` kernel of ``config`` compiled for sm_90a: (ptxas's registers, shared
    bytes, cp.async copies in the PTX, whether all of them come after the wait)."""
    from bench.int4_rows_ptx import registers, sm90_compiled
    n, k, norm, res = SHAPES[product]
    block_n, block_k, warps, ahead, stages, turns = config
    values = dict(EPS=1e-5, OFFSET=0.0, N=n, K=k, HAS_NORM=norm, HAS_RES=res,
                  BLOCK_N=block_n, BLOCK_K=block_k, AHEAD=ahead, STAGES=stages,
                  TURNS=turns, W_AHEAD=True, ROT_ROWS=0, HEAD_D=0)
    kernel = sm90_compiled(pipe_gemv_kernel_gdc, {}, values, warps)
    ptx = kernel.asm["ptx"]
    copies = [m.start() for m in re.finditer(r"cp\.async\.c[ag]\.shared", ptx)]
    wait = ptx.find("griddepcontrol.wait")
    return (int(registers(ptx)), kernel.metadata.shared, len(copies),
            bool(copies) and 0 <= wait < min(copies))


def main() -> None:
    for name, changes in CHANGES.items():
        for product, config in changes.items():
            regs, shared, copies, after = compiled(product, config)
            print(f"{name:56s} {str(config):30s} registers {regs:3d}, shared {shared:6d} B, "
                  f"cp.async {copies:3d}{', all after the wait' if after else ''}",
                  flush=True)


if __name__ == "__main__":
    main()
