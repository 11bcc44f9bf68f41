"""decode_chain_cuda.py's variants that split a product along K (kernels/split_gemv_triton.py:
SPLIT programs a block of rows, each over a part of the columns, the last to finish
joining them): down's 5,632 columns do not fit ahead of the wait in registers as whole
rows, a part of 2,816 or 1,408 does. Each variant changes products of "dependent + join"
(the built library's choice), and is named by what it changes:

    python bench/decode_chain_cuda.py --rounds 30 --variants "dependent + join,dependent
        + join + split down 2 parts 4 rows,..."      (on the GPU machine)
    python bench/decode_chain_cuda.py --int8 --rounds 30 --variants "dependent + join,
        dependent + join + int8 split down 2 parts 4 rows whole part ahead,..."

Without a GPU, ``python bench/decode_chain_split.py`` compiles the ``_gdc`` form of each
variant's kernels here and of decode_chain_rowloop.py's int8 row loops for sm_90a
(Triton and its bundled ptxas) and prints registers, the programs a multiprocessor
holds by registers and the grid: a grid larger than 132 x that runs in two waves.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# a split product's configuration: (BLOCK_N, BLOCK_K, warps, AHEAD, SPLIT); ~1.1B down:
# a half is 2,816 columns, a quarter 1,408; o: a half 1,024
DOWN_SPLITS = {
    "split down 2 parts 4 rows": (4, 256, 4, 2048, 2),
    "split down 2 parts 4 rows whole part ahead": (4, 512, 4, 4096, 2),
    "split down 2 parts 8 rows 8 warps": (8, 256, 8, 2048, 2),
    "split down 4 parts 4 rows": (4, 128, 4, 1024, 4),
    "split down 4 parts 4 rows whole part ahead": (4, 512, 4, 2048, 4),
    "split down 4 parts 8 rows 8 warps whole part ahead": (8, 512, 8, 2048, 4),
    "split down 4 parts 2 rows whole part ahead": (2, 512, 4, 2048, 4),
}
# name -> {product: configuration}; a 5-tuple is a split launch, the rest launch_row_gemv's
CHANGES = {
    **{name: {"down": config} for name, config in DOWN_SPLITS.items()},
    "split o 2 parts 2 rows 4 warps": {"o": (2, 512, 4, 1024, 2)},
    # o with 4 warps (0.977 of the chain once) with down split
    "o 2 rows 4 warps + split down 2 parts 4 rows": {
        "o": (2, 512, 4, 2048), "down": DOWN_SPLITS["split down 2 parts 4 rows"]},
    "o 2 rows 4 warps + split down 4 parts 8 rows 8 warps whole part ahead": {
        "o": (2, 512, 4, 2048),
        "down": DOWN_SPLITS["split down 4 parts 8 rows 8 warps whole part ahead"]},
    # with --int8: 1,024 columns a tile; a half's 2,816 bytes fit ahead as 4,096
    "int8 split down 2 parts 4 rows whole part ahead": {"down": (4, 1024, 4, 4096, 2)},
    "int8 split down 2 parts 8 rows 8 warps whole part ahead": {
        "down": (8, 1024, 8, 4096, 2)},
    "int8 split down 4 parts 4 rows whole part ahead": {"down": (4, 1024, 4, 2048, 4)},
    "int8 split o 2 parts 4 rows whole part ahead": {"o": (4, 1024, 4, 1024, 2)},
}


class SplitLaunch:
    """A chain configuration that is a launch of its own: the product split along K,
    its counters made on the first (uncaptured) call and shared by every layer."""

    def __init__(self, config: tuple):
        self.config, self.counts = config, None

    def __call__(self, x, weight, scale, fold: dict, pdl: bool) -> torch.Tensor:
        from targets.aoti.kernels.split_gemv_triton import launch_split_gemv, split_counters
        if fold.get("norm") is not None or fold.get("act"):
            raise ValueError("a split product takes no norm and no gated activation")
        if self.counts is None:
            self.counts = split_counters(weight, self.config)
        return launch_split_gemv(x, weight, None, fold.get("residual"), self.counts,
                                 self.config, pdl, scale)

    def __repr__(self) -> str:  # the row's "configs" in the bench's JSON
        return f"split{self.config}"


def split_variants(default: dict) -> dict:
    """decode_chain_cuda.variants()'s entries: "dependent + join" with CHANGES' products
    (each variant its own counters)."""
    return {f"dependent + join + {name}": (True, {**default, **{
        product: SplitLaunch(c) if len(c) == 5 else c for product, c in changes.items()}},
        None, True) for name, changes in CHANGES.items()}


# (rows, columns, norm, gated, residual, rotary rows) of the ~1.1B's products
SHAPES = {"qkv": (2560, 2048, True, 0, False, 2304), "o": (2048, 2048, False, 0, True, 0),
          "gate_up": (5632, 2048, True, 1, False, 0), "down": (2048, 5632, False, 0, True, 0)}


def compiled_registers(product: str, config: tuple, int8: bool) -> int:
    """ptxas's registers a thread of the ``_gdc`` kernel a configuration launches."""
    import triton

    from bench.int4_rows_ptx import registers, sm90_ptx
    n, k, norm, act, res, rotary = SHAPES[product]
    if len(config) == 5:
        from targets.aoti.kernels.split_gemv_triton import split_gemv_kernel_gdc as kernel
        block_n, block_k, warps, ahead, split = config
        values = dict(N=n, K=k, HAS_BIAS=False, HAS_RES=res, HAS_SCALE=int8, SPLIT=split,
                      PART=triton.cdiv(k, split), BLOCK_N=block_n, BLOCK_K=block_k,
                      AHEAD=ahead, W_AHEAD=True)
    else:
        from targets.aoti.kernels.row_loop_triton import row_loop_kernel_gdc as kernel
        block_n, block_k, warps, ahead, _, turns = config
        values = dict(EPS=1e-5, OFFSET=0.0, N=n, K=k, HAS_BIAS=False, HAS_NORM=norm,
                      ACT=act, HAS_RES=res, HAS_SCALE=int8, BLOCK_N=block_n,
                      BLOCK_K=block_k, AHEAD=ahead, TURNS=turns, W_AHEAD=True,
                      ROT_ROWS=rotary, HEAD_D=64 if rotary else 0)
    kinds = {"w_ptr": "*i8" if int8 else "*fp16", "part_ptr": "*fp32", "counts_ptr": "*i32"}
    return int(registers(sm90_ptx(kernel, kinds, values, warps)))


def resident(registers: int, warps: int) -> int:
    """Programs a Hopper multiprocessor holds by registers and warps (64K registers,
    a warp's allocated 256 at a time; 64 warps; 32 programs): shared memory not
    counted (a few KB of a reduction's scratch a program)."""
    per_warp = -(-registers * 32 // 256) * 256
    return min(32, 64 // warps, 65536 // (per_warp * warps))


def grid(product: str, config: tuple) -> int:
    n = SHAPES[product][0]
    blocks = -(-n // config[0])
    return blocks * config[4] if len(config) == 5 else -(-blocks // config[5])


def main() -> None:
    from bench.decode_chain_rowloop import INT8_CHANGES
    checked = [(name, changes, name.startswith("int8")) for name, changes in CHANGES.items()]
    checked += [(name, changes, True) for name, changes in INT8_CHANGES.items()]
    # the wired fp16 row loop: 81 registers, 5 a multiprocessor (for comparison)
    checked.append(("(fp16 gate/up row loop, wired)",
                    {"gate_up": (2, 512, 4, 2048, False, 5)}, False))
    for name, changes, int8 in checked:
        for product, config in changes.items():
            if len(config) == 4:  # the one-block kernel: gemv_config's shapes, known
                continue
            regs = compiled_registers(product, config, int8)
            fits = resident(regs, config[2]) * 132
            print(f"{name:66s} {product:8s} {str(config):28s} registers {regs:3d}, "
                  f"{fits // 132:2d} a multiprocessor, grid {grid(product, config):5d}"
                  f"{' (more than one wave)' if grid(product, config) > fits else ''}",
                  flush=True)


if __name__ == "__main__":
    main()
