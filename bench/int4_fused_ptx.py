"""Without a GPU: the int4 forms of the attention + o launch and of the head's token
kernel (``Generation.int4_fused``) at the ~1.1B's shapes, compiled for sm_90a beside the
kernels they replace or extend, with ptxas's registers and spills, the shared bytes,
and how many programs an H200 SM holds at once (the attention + o launch's spin needs
its whole grid resident or dispatched in order: 16 + 512 programs over 132 SMs).

    PYTHONPATH=/tmp/gp-triton:. python bench/int4_fused_ptx.py [--out ROWS.jsonl]

Needs Triton and its bundled ptxas (bench/int4_rows_ptx.py's compile).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.int4_rows_ptx import ATTENTION_STRIDES, ptxas_report, sm90_compiled  # noqa: E402

HEADS, KV_HEADS, DIM, SLOTS, O_ROWS, VOCAB, HIDDEN, GROUP = 32, 4, 64, 512, 2048, 32000, \
    2048, 128
SM_REGISTERS, SM_SHARED, SM_WARPS, SMS = 65536, 228 * 1024, 64, 132


def _attention_o(store: bool, int4: bool):
    from targets.aoti.kernels import attention_o_triton as ao
    from targets.aoti.kernels.attention_o_slots import attention_splits
    from targets.aoti.kernels.int4_triton import groups_a_step
    splits = attention_splits(False)  # fp16 and int4 o rows: 4 blocks a key/value head
    values = dict(SCALE=DIM ** -0.5, S=SLOTS, D=DIM, G=HEADS // KV_HEADS, KVH=KV_HEADS,
                  SPLITS=splits, BLOCK_S=SLOTS // splits, BLOCK_G=16, BLOCK_D=DIM,
                  IEEE=False, JOIN_G=HEADS // KV_HEADS, BLOCK_J=splits, N=O_ROWS,
                  K=HEADS * DIM, BLOCK_N=ao.ROWS, HAS_SCALE=False,
                  GROUP=GROUP if int4 else 0,
                  BLOCK_G4=groups_a_step(ao.ROWS, 4, HEADS * DIM, GROUP) if int4 else 1,
                  POLL=1, CACHE_AHEAD=True, sm=1)
    kinds = {name: "*fp32" for name in ("m_ptr", "l_ptr", "acc_ptr")}
    kinds.update(counts_ptr="*i32", flags_ptr="*i32", pos_ptr="*i64")
    if int4:
        kinds["w_ptr"] = "*u8"
    kernel = ao.attention_o_store_kernel_gdc if store else ao.attention_o_kernel_gdc
    # slot and reset: int32 arguments as the strides are
    return sm90_compiled(kernel, kinds, values, 4, ATTENTION_STRIDES + ("slot", "reset"))


def _int4_head(token: bool):
    from targets.aoti.kernels import head_argmax_triton, int4_triton
    block_n, block_g, warps, split_x = int4_triton.int4_config(VOCAB, HIDDEN, GROUP, False)
    values = dict(EPS=1e-5, OFFSET=0.0, N=VOCAB, K=HIDDEN, GROUP=GROUP, HAS_BIAS=False,
                  HAS_NORM=True, BLOCK_N=block_n, BLOCK_G=block_g, SPLIT_X=split_x)
    kinds = {"w_ptr": "*u8", "slot_ptr": "*i64"}
    if token:
        return sm90_compiled(head_argmax_triton.int4_head_argmax_kernel_gdc, kinds, values,
                             warps), warps
    values.update(ACT=0, HAS_RES=False, ROT_ROWS=0, HEAD_D=0)
    return sm90_compiled(int4_triton.int4_row_gemv_kernel_gdc, kinds, values, warps), warps


def resident(registers: int, shared: int, warps: int) -> int:
    """Programs of ``warps`` warps an SM holds at once: registers in 256-register units a
    warp, shared bytes plus 1 KB a program, at most 64 warps."""
    per_warp = -(-registers * 32 // 256) * 256
    by_registers = SM_REGISTERS // (per_warp * warps) if registers else SM_WARPS // warps
    return min(by_registers, SM_SHARED // (shared + 1024), SM_WARPS // warps)


KERNELS = {  # name -> (compile: (compiled, warps), grid at the ~1.1B's shape)
    "attention_o_kernel_gdc, fp16 o rows": (lambda: (_attention_o(False, False), 4), 528),
    "attention_o_kernel_gdc, int4 o rows": (lambda: (_attention_o(False, True), 4), 528),
    "attention_o_store_kernel_gdc, fp16 o rows": (lambda: (_attention_o(True, False), 4), 528),
    "attention_o_store_kernel_gdc, int4 o rows": (lambda: (_attention_o(True, True), 4), 528),
    "int4_row_gemv_kernel_gdc, the head (today)": (lambda: _int4_head(False), VOCAB // 8),
    "int4_head_argmax_kernel_gdc, the head with its token": (lambda: _int4_head(True),
                                                              VOCAB // 8),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    for name, (compile_, grid) in KERNELS.items():
        made, warps = compile_()
        registers, spills = ptxas_report(made.asm["ptx"])
        shared = made.metadata.shared
        per_sm = resident(registers, shared, warps)
        rows.append(dict(kernel=name, registers=registers, spilled_bytes=spills,
                         shared_bytes=shared, warps=warps, programs_an_sm=per_sm, grid=grid,
                         grid_resident=per_sm * SMS >= grid))
        print(f"{name:55s} registers {registers:3d}, spilled {spills:4d} B, shared "
              f"{shared:6d} B, {per_sm} programs an SM ({per_sm * SMS} of {grid} resident)",
              flush=True)
    if args.out:
        with args.out.open("a") as out:
            for row in rows:
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
