"""decode_chain_cuda.py's variants that run each layer's gate/up and down as one launch
(targets/aoti/kernels/mlp_triton.py: down split along the intermediate rows, fused into
gate/up's row loop, the programs' partials added into one accumulator by atomics, the
last program joining; no program waits on another) in place of two products
(``configs["gate_up_down"]``), on top of the library's chain ("dependent + join +
attention-o joined 4 splits 4 rows" at fp16, "... 8 splits 4 rows" over int8 rows:
``--int8``). Each layer's down weight is transposed once, on the chain's first
(uncaptured) call; its bytes replace down's.

    python bench/decode_chain_mlp.py      (no GPU: sm_90a registers of each variant)

Variants: the accumulator in fp32 (atomic adds: the order of the sums varies) or int64
fixed point (exact: the same result whatever the order), and the grid's programs a
multiprocessor, rows a block and warps.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BASE = "dependent + join + attention-o joined 4 splits 4 rows"
INT8_BASE = "dependent + join + attention-o joined 8 splits 4 rows"
HIDDEN, INTER = 2048, 5632

# name -> (int64 fixed point, programs a multiprocessor, rows a block, warps)
# (2 rows with 4 warps spill at fp32: 128 registers and 28 bytes spilled)
CHANGES = {
    "fused MLP fp32 1/SM 2 rows 8 warps": (False, 1, 2, 8),
    "fused MLP fp32 2/SM 2 rows 8 warps": (False, 2, 2, 8),
    "fused MLP fp32 1/SM 4 rows 8 warps": (False, 1, 4, 8),
    # more bytes in flight a SM, more atomics (int64 at 4 rows: 139 registers, one a SM)
    "fused MLP fp32 2/SM 4 rows 8 warps": (False, 2, 4, 8),
    "fused MLP fp32 3/SM 2 rows 8 warps": (False, 3, 2, 8),
    "fused MLP int64 1/SM 2 rows 8 warps": (True, 1, 2, 8),
    "fused MLP int64 2/SM 2 rows 8 warps": (True, 2, 2, 8),
    "fused MLP int64 1/SM 4 rows 8 warps": (True, 1, 4, 8),
}


class GatedMLP:
    """decode_chain_cuda.step's ``configs["gate_up_down"]``: (o, layer, norm, pdl) -> the
    layer's output, one launch_gated_mlp of ``config`` (mlp_config's tuple), its
    accumulator int64 (``fixed``) or fp32; the buffers and each layer's down_t made on
    the first (uncaptured) call."""

    def __init__(self, fixed: bool, config: tuple):
        self.fixed, self.config = fixed, config
        self.state: dict = {}
        self.down_t: dict = {}

    def __repr__(self) -> str:  # the row's "configs" in the bench's JSON
        return f"gated-mlp {'int64' if self.fixed else 'fp32'} {self.config}"

    def __call__(self, o: torch.Tensor, layer: dict, norm: torch.Tensor, pdl: bool):
        from targets.aoti.kernels.mlp_triton import launch_gated_mlp, mlp_accumulator
        (gate_up, gate_scale), (down, down_scale) = layer["gate_up"], layer["down"]
        if not self.state:
            self.state["acc"], self.state["counts"] = mlp_accumulator(
                down.shape[0], self.fixed, o.device)
        key = id(down)
        if key not in self.down_t:  # [I, N]: a row of down's output columns each
            self.down_t[key] = down.t().contiguous()
        return launch_gated_mlp(o, gate_up, self.down_t[key], norm, o, 1e-5, 0.0, 1,
                                self.state["acc"], self.state["counts"], self.config, pdl,
                                gate_up_scale=gate_scale, down_scale=down_scale)


def mlp_variant_config(per_sm: int, block_n: int, warps: int, sms: int) -> tuple:
    from targets.aoti.kernels.mlp_triton import mlp_config
    return mlp_config(INTER, HIDDEN, HIDDEN, sms, per_sm, block_n, warps)


def mlp_variants(chosen: dict, sms: int) -> dict:
    """decode_chain_cuda.variants()'s entries: each base in ``chosen`` (BASE, INT8_BASE)
    with each layer's gate/up and down as one launch, and the base again as a control
    ("nothing changed")."""
    found = {}
    for name in (BASE, INT8_BASE):
        if name not in chosen:
            continue
        pdl, base, *rest = chosen[name]
        if f"{name} + nothing changed" not in chosen:  # the control, unless given
            found[f"{name} + nothing changed"] = (pdl, dict(base), *rest)
        for change, (fixed, per_sm, block_n, warps) in CHANGES.items():
            mlp = GatedMLP(fixed, mlp_variant_config(per_sm, block_n, warps, sms))
            found[f"{name} + {change}"] = (pdl, {**base, "gate_up_down": mlp}, *rest)
    return found


def compiled(fixed: bool, config: tuple, int8: bool = False) -> tuple:
    """The ``_gdc`` form at the ~1.1B's shape compiled for sm_90a here (``int8``: over
    int8 rows): (registers, spilled bytes, shared bytes, the PTX's atomic instructions,
    its global loads before the wait)."""
    from bench.int4_rows_ptx import ptxas_report, sm90_compiled
    from targets.aoti.kernels.mlp_triton import gated_mlp_kernel_gdc
    block_n, block_k, warps, ahead, turns = config
    values = dict(EPS=1e-5, OFFSET=0.0, I=INTER, K=HIDDEN, N=HIDDEN, N_POW=HIDDEN,
                  HAS_NORM=True, ACT=1, HAS_RES=True, HAS_SCALE=int8, FIXED=fixed,
                  BLOCK_N=block_n,
                  BLOCK_K=block_k, AHEAD=ahead, TURNS=turns, W_AHEAD=True)
    kinds = {"acc_ptr": "*i64" if fixed else "*fp32", "counts_ptr": "*i32"}
    if int8:
        kinds.update(w_ptr="*i8", d_ptr="*i8")
    made = sm90_compiled(gated_mlp_kernel_gdc, kinds, values, warps)
    ptx = made.asm["ptx"]
    regs, spills = ptxas_report(ptx)
    atomics = sum(ptx.count(op) for op in ("red.global", "atom.global"))
    before = ptx.split("griddepcontrol.wait")[0].count("ld.global")
    return regs, spills, made.metadata.shared, atomics, before


def main() -> None:
    for (name, (fixed, per_sm, block_n, warps)), int8 in [
            (change, int8) for int8 in (False, True) for change in CHANGES.items()]:
        config = mlp_variant_config(per_sm, block_n, warps, 132)
        regs, spills, shared, atomics, before = compiled(fixed, config, int8)
        name = f"{'int8 rows ' if int8 else ''}{name}"
        print(f"{name:48s} {config}  registers {regs:3d}, spilled {spills:4d} B, "
              f"shared {shared:6d} B, atomics in the PTX {atomics}, "
              f"global loads before the wait {before}", flush=True)


if __name__ == "__main__":
    main()
