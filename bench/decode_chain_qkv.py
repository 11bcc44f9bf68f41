"""A layer's q/k/v product, attention and o as one launch in decode_chain_cuda.py's chain
(targets/aoti/kernels/qkv_attention_o_triton.py, not an op yet), through the chain's own
hooks: ``configs["qkv"]`` (a callable: the q/k/v launch left to the joined one, no
kernel) and ``configs["attention_o"]`` (the joined launch, from the layer's input).
Plain launches run the chain's own kernels (the bench's reference).

The base is the library's "dependent + join + attention-o joined 4 splits 4 rows"
(fp16 rows; "... 8 splits 4 rows" over int8 rows, ``--int8``), with its "+ nothing
changed" control; the chain's q/k/v has no rotary rows
(neither does the base's), so neither launch rotates here.

    PYTHONPATH=/tmp/gp-triton:. python bench/decode_chain_qkv.py [--out ROWS.jsonl]

(without a GPU) compiles each variant's kernel for sm_90a: ptxas's registers and spills,
the shared bytes, its grid and how many of its programs an H200 holds at once (the
kernel's docstring: why its spins end).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HEADS, KV_HEADS, DIM, SLOTS, HIDDEN, SMS = 32, 4, 64, 512, 2048, 132
BASE = "dependent + join + attention-o joined 4 splits 4 rows"
# name -> (q/k/v rows a program, their columns ahead, columns a step, blocks of slots a
# key/value head, o's rows a program, warps); each grid resident at once (__main__)
CONFIGS = {
    "qkv-attention-o 8 rows 1024 ahead": (8, 1024, 512, 4, 8, 4),  # the kernel's CONFIG
    "qkv-attention-o 8 rows 256 ahead": (8, 256, 256, 4, 8, 4),
    "qkv-attention-o 16 rows 512 ahead": (16, 512, 256, 4, 8, 4),
}
# the first configuration with the cache read after the spin (no prefetch before the wait)
AFTER = "qkv-attention-o 8 rows 1024 ahead cache after the wait"
# over int8 rows (``--int8``): o's 8 rows a program held 156+ registers (its whole rows as
# fp32), so o keeps 4 and q/k/v takes 32 (80 programs) for the grid to stay resident
INT8_BASE = "dependent + join + attention-o joined 8 splits 4 rows"
INT8_CONFIGS = {
    "qkv-attention-o int8 32 rows 256 ahead": (32, 256, 256, 8, 4, 4),
    "qkv-attention-o int8 32 rows 128 ahead": (32, 128, 256, 8, 4, 4),
    "qkv-attention-o int8 32 rows 256 ahead 4 splits": (32, 256, 256, 4, 4, 4),
}


class QkvRows:
    """``configs["qkv"]``: dependent launches leave q/k/v to the joined launch (an empty
    row, no kernel: the attention_o hook ignores it); plain ones launch the chain's,
    unless ``own_plain`` (under Triton's interpreter), at the base's ``config``."""

    def __init__(self, own_plain: bool = False, config: tuple | None = None):
        self.own_plain, self.config = own_plain, config

    def __call__(self, x, rows, scale, fold, pdl):
        from targets.aoti.kernels.triton_kernels import launch_row_gemv
        if pdl or self.own_plain:
            return torch.empty((*x.shape[:-1], rows.shape[0]), dtype=x.dtype,
                               device=x.device)
        return launch_row_gemv(x, rows, None, fold.get("norm"), None, 1e-5, 0.0, 0,
                               self.config, False, scale)

    def __repr__(self) -> str:
        return "q/k/v in the joined launch"


class QkvAttentionO:
    """``configs["attention_o"]``: (q, k, v, h, layer, made, pdl) -> o, the joined launch
    from ``h`` at ``config`` (q, k and v unused: its own); plain launches answer None
    unless ``own_plain``; ``cache_ahead``: the past rows prefetched into L2 before the
    wait (the base reads them before its wait too). The shapes are the layer's (heads:
    o's columns over the cache's width)."""

    def __init__(self, config: tuple, own_plain: bool = False, cache_ahead: bool = True):
        self.config, self.own_plain, self.cache_ahead = config, own_plain, cache_ahead
        self.state: dict = {}

    def __repr__(self) -> str:  # the row's "configs" in the bench's JSON
        return f"qkv-attention-o {self.config}"

    def __call__(self, q, k, v, h, layer: dict, made: dict, pdl: bool):
        from targets.aoti.kernels.attention_o_slots import SLOTS as FLAG_SLOTS
        from targets.aoti.kernels.attention_o_slots import STRIDE, flag_slots
        from targets.aoti.kernels.qkv_attention_o_triton import launch_qkv_attention_o
        if not pdl and not self.own_plain:
            return None
        past_k, dim = layer["k"], layer["k"].shape[-1]
        if not self.state:  # made on the first (uncaptured) call, shared by all layers
            self.state = {
                "counts": torch.zeros(past_k.shape[1], dtype=torch.int32, device=h.device),
                "flags": torch.zeros(FLAG_SLOTS * STRIDE, dtype=torch.int32,
                                     device=h.device)}
        index = next(i for i, each in enumerate(made["layers"]) if each is layer)
        slot, reset = flag_slots(len(made["layers"]))[index]
        return launch_qkv_attention_o(
            h, layer["qkv"][0], made["norm"], 1e-5, 0.0, None, None,
            layer["o"][0].shape[1] // dim, past_k, layer["v"], made["mask"], dim ** -0.5,
            self.state["counts"], layer["o"][0], self.state["flags"], slot, reset,
            self.config, pdl=pdl, cache_ahead=self.cache_ahead, qkv_scale=layer["qkv"][1],
            o_scale=layer["o"][1])[0]


def qkv_variants(chosen: dict) -> dict:
    """decode_chain_cuda.variants()'s entries: the base (``chosen[BASE]``) with q/k/v,
    the attention and o as one launch at each of CONFIGS, and AFTER; INT8_BASE's at each
    of INT8_CONFIGS (for ``--int8``)."""
    def entry(base, config, cache_ahead=True):
        pdl, configs, *rest = chosen[base]
        return (pdl, {**configs, "qkv": QkvRows(config=configs.get("qkv")),
                      "attention_o": QkvAttentionO(config, cache_ahead=cache_ahead)}, *rest)
    found = {f"dependent + join + {name}": entry(BASE, config)
             for name, config in CONFIGS.items()}
    found[f"dependent + join + {AFTER}"] = entry(BASE, next(iter(CONFIGS.values())), False)
    if INT8_BASE in chosen:
        found.update({f"dependent + join + {name}": entry(INT8_BASE, config)
                      for name, config in INT8_CONFIGS.items()})
    return found


def compiled(config: tuple, int8: bool = False):
    """The ``_gdc`` kernel at the ~1.1B's shape and ``config``, compiled for sm_90a
    (``int8``: q/k/v's and o's rows int8 with their scales)."""
    from bench.int4_rows_ptx import sm90_compiled
    from targets.aoti.kernels import qkv_attention_o_triton as qao
    block_q, ahead, block_kq, splits, block_n, warps = config
    groups = HEADS // KV_HEADS
    values = dict(EPS=1e-5, OFFSET=0.0, HIDDEN=HIDDEN, HAS_NORM=True, ROT_ROWS=0,
                  BLOCK_Q=block_q, BLOCK_KQ=block_kq, AHEAD=ahead, SCALE=DIM ** -0.5,
                  S=SLOTS, D=DIM, G=groups, KVH=KV_HEADS, SPLITS=splits,
                  BLOCK_S=SLOTS // splits, BLOCK_G=16, BLOCK_D=DIM, IEEE=False,
                  JOIN_G=groups, BLOCK_J=splits, N=HIDDEN, BLOCK_N=block_n, POLL=1,
                  STORE=False, CACHE_AHEAD=True, WORDS=int8, HAS_SCALE=int8, PRMT=True, sm=1)
    kinds = {name: "*fp32" for name in ("m_ptr", "l_ptr", "acc_ptr")}
    if int8:
        kinds.update(wq_ptr="*i8", wo_ptr="*i8")
    kinds.update(counts_ptr="*i32", flags_ptr="*i32", pos_ptr="*i64")
    # slot and reset: int32 arguments as the strides are
    return sm90_compiled(qao.qkv_attention_o_kernel_gdc, kinds, values, warps,
                         ("spk_h", "spk_s", "spv_h", "spv_s", "slot", "reset"))


def resources(config: tuple, int8: bool = False) -> dict:
    from bench.int4_rows_ptx import ptxas_report
    from targets.aoti.kernels.qkv_attention_o_triton import grid_programs, resident_programs
    kernel = compiled(config, int8)
    regs, spills = ptxas_report(kernel.asm["ptx"])
    shared = kernel.metadata.shared
    grid = grid_programs((HEADS + 2 * KV_HEADS) * DIM, KV_HEADS, HIDDEN, config)
    resident = resident_programs(regs, config[-1], shared, SMS)
    return {"config": config, "int8": int8, "registers": regs, "spill_bytes": spills, "shared": shared,
            "grid": grid, "resident_at_once": resident, "whole_grid_resident":
            resident >= grid}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    for name, config, int8 in [*((n, c, False) for n, c in CONFIGS.items()),
                               *((n, c, True) for n, c in INT8_CONFIGS.items())]:
        row = {"variant": name, **resources(config, int8)}
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
