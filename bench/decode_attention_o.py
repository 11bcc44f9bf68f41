"""A layer's attention and o (+ residual) as one launch in decode_chain_cuda.py's chain
(``configs["attention_o"]``), in two forms:
- "fused" (decode_attention_o_fused.py): o split along K by key/value head, each
  program a head's whole attention (computed again for every block of o's rows) times
  its tile of Wo, the last of a block's heads joining;
- "joined" (decode_attention_o_flag.py): the library's attention blocks and join, and
  o's rows in the same grid, spinning on a flag the joins count on after their wait.
Either way o's weights are loaded ahead of the launch's wait, and a layer has four
kernels, not five. In the 22-layer chain on the H200 the fused form loses 14-50% (each
program reads its head's whole cache again and loops over it: 12.7-21.7 us a layer
against 6.9); the joined form with the attention in 4 blocks of 128 slots and o 4 rows a
program was 0.973 of "dependent + join" at fp16 (attention and o 5.8 us a layer against
6.95), 8 blocks 0.970 at int8; with the library's 16 blocks of 32 slots it gains little
(0.987-1.000). Not the library's yet: one more confirmation, then the wiring.

    python bench/decode_attention_o.py      (no GPU: sm_90a registers of each variant)

The int4 chain (``--int4``) takes the joined form's variants over int4 rows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from targets.aoti.kernels.attention_o_slots import flag_slots  # noqa: E402


class AttentionO:
    """decode_chain_cuda.step's ``configs["attention_o"]``: (q, k, v, h, layer, made,
    pdl) -> o, one launch of ``form`` ("fused": blocks of rows, slots a loop step, warps,
    stages; "joined": blocks of slots, rows a program, warps, polling threads, ns between
    polls). Plain launches answer None (the chain's own attention and o: the bench's
    reference), unless ``own_plain`` (under Triton's interpreter)."""

    def __init__(self, form: str, *config, own_plain: bool = False):
        self.form, self.config, self.own_plain = form, config, own_plain
        self.state: dict = {}

    def __repr__(self) -> str:  # the row's "configs" in the bench's JSON
        return f"attention-o {self.form}{self.config}"

    def _buffers(self, made: dict, device) -> dict:
        if not self.state:  # made on the first (uncaptured) call, shared by all layers
            from bench.decode_attention_o_flag import joined_state
            kv_heads = made["layers"][0]["k"].shape[1]
            self.state = joined_state(kv_heads, 3, device)
            self.state["row_counts"] = torch.zeros(4096, dtype=torch.int32, device=device)
        return self.state

    def __call__(self, q, k, v, h, layer: dict, made: dict, pdl: bool):
        if not pdl and not self.own_plain:
            return None
        state = self._buffers(made, q.device)
        args = (q, layer["k"], k, layer["v"], v, made["mask"], layer["o"][0], h)
        if self.form == "fused":
            from bench.decode_attention_o_fused import launch_fused_attention_o
            blocks, block_s, warps, stages = self.config
            return launch_fused_attention_o(*args, state["row_counts"], blocks, block_s,
                                            warps, stages, pdl, layer["o"][1])
        from bench.decode_attention_o_flag import launch_joined_attention_o
        index = next(i for i, each in enumerate(made["layers"]) if each is layer)
        slot, reset = flag_slots(len(made["layers"]))[index]
        splits, block_n, warps, poll, ns = self.config
        packed, scales = layer["o"]
        int4 = int4_steps(block_n, warps, q.shape[1] * q.shape[-1], scales.shape[1]) if (
            packed.dtype == torch.uint8) else ()
        return launch_joined_attention_o(*args, state, slot, reset, splits, block_n,
                                         warps, poll, ns, pdl, scales, int4)


def int4_steps(block_n: int, warps: int, cols: int, groups: int) -> tuple:
    """(groups a step, SPLIT_X) of int4 rows in o's programs of ``block_n`` rows and
    ``warps``: int4_triton's rule (16 bytes a thread a step; the nibbles joined in the
    bytes' order, as for a product not gated), as the library's launch takes it."""
    from targets.aoti.kernels.int4_triton import groups_a_step
    return groups_a_step(block_n, warps, cols, cols // groups), False


# name -> (form, its configuration)
CHANGES = {
    # fused: (blocks of o's rows, slots a step of the attention's loop, warps, stages)
    "attention-o fused 16 blocks 8 warps": ("fused", 16, 64, 8, 2),
    "attention-o fused 32 blocks 8 warps": ("fused", 32, 64, 8, 2),
    "attention-o fused 32 blocks 4 warps": ("fused", 32, 64, 4, 2),
    "attention-o fused 32 blocks 8 warps 128 slots": ("fused", 32, 128, 8, 2),
    "attention-o fused 32 blocks 8 warps 256 slots": ("fused", 32, 256, 8, 2),
    "attention-o fused 64 blocks 8 warps": ("fused", 64, 64, 8, 2),
    "attention-o fused 64 blocks 8 warps 128 slots": ("fused", 64, 128, 8, 2),
    "attention-o fused 64 blocks 4 warps": ("fused", 64, 64, 4, 2),
    "attention-o fused 128 blocks 4 warps": ("fused", 128, 64, 4, 2),
    # joined: (blocks of slots a key/value head, o's rows a program, warps, polling
    # threads, ns between polls)
    "attention-o joined 16 splits 2 rows": ("joined", 16, 2, 4, 1, 64),
    "attention-o joined 16 splits 4 rows": ("joined", 16, 4, 4, 1, 64),
    "attention-o joined 16 splits 8 rows 8 warps": ("joined", 16, 8, 8, 1, 64),
    "attention-o joined 4 splits 2 rows": ("joined", 4, 2, 4, 1, 64),
    "attention-o joined 16 splits 2 rows 256 ns": ("joined", 16, 2, 4, 1, 256),
    "attention-o joined 16 splits 2 rows 32 polling": ("joined", 16, 2, 4, 32, 64),
    "attention-o joined 16 splits 8 rows": ("joined", 16, 8, 4, 1, 64),
    "attention-o joined 16 splits 4 rows 8 warps": ("joined", 16, 4, 8, 1, 64),
    "attention-o joined 8 splits 4 rows": ("joined", 8, 4, 4, 1, 64),
    "attention-o joined 4 splits 4 rows": ("joined", 4, 4, 4, 1, 64),
    "attention-o joined 4 splits 8 rows": ("joined", 4, 8, 4, 1, 64),
    # o not waiting for the attention at all: wrong output, the time such a launch
    # would take with a free flag
    "attention-o joined 16 splits 4 rows unwaited floor": ("joined", 16, 4, 4, -1, 64),
}


def attention_o_variants(default: dict) -> dict:
    """decode_chain_cuda.variants()'s entries: "dependent + join" with a layer's attention
    and o as one launch."""
    return {f"dependent + join + {name}": (True, {**default, "attention_o": AttentionO(
        *change)}, None, True) for name, change in CHANGES.items()}


# int4 rows: the joined form only (the fused one lost at fp16 and int8 by 14-50%)
INT4_CHANGES = {name: change for name, change in CHANGES.items()
                if change[0] == "joined" and "floor" not in name and "ns" not in name
                and "polling" not in name}


def attention_o_int4_variants(int4_chosen: dict) -> dict:
    """decode_chain_int4.int4_variants()'s entries for ``--int4``: "int4 dependent +
    join" (from ``int4_chosen``) with a layer's attention and o as one launch."""
    pdl, base, *rest = int4_chosen["int4 dependent + join"]
    return {f"int4 dependent + join + {name}": (pdl, {**base, "attention_o": AttentionO(
        *change)}, *rest) for name, change in INT4_CHANGES.items()}


def compiled(form: str, *config, int4: bool = False) -> tuple:
    """The ``_gdc`` form at the ~1.1B's shape (32 heads over 4, 64 wide, 512 slots, o
    2048 x 2048) compiled for sm_90a here: (registers, spilled bytes, shared
    bytes, the PTX's global loads before, between and after its waits, its cp.async)."""
    from bench.int4_rows_ptx import ATTENTION_STRIDES, ptxas_report, sm90_compiled
    query = torch.empty(1, 32, 1, 64, dtype=torch.float16, device="meta")
    past = torch.empty(1, 4, 512, 64, dtype=torch.float16, device="meta")
    weight = torch.empty(2048, 2048, dtype=torch.float16, device="meta")
    options = {}
    if form == "fused":
        from bench.decode_attention_o_fused import fused_kernel_gdc as kernel
        from bench.decode_attention_o_fused import fused_sizes
        blocks, block_s, warps, stages = config
        values = fused_sizes(query, past, weight, blocks, block_s)
        options["num_stages"] = stages
        kinds = {"part_ptr": "*fp32", "counts_ptr": "*i32"}
        values["HAS_SCALE"] = False
    else:
        from bench.decode_attention_o_flag import joined_kernel_gdc as kernel
        from bench.decode_attention_o_flag import joined_sizes
        splits, block_n, warps, poll, ns = config
        values = joined_sizes(query, past, weight, splits, block_n, poll, ns)
        kinds = {"m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32",
                 "counts_ptr": "*i32", "flag_ptr": "*i32", "reset_ptr": "*i32",
                 "err_ptr": "*i32"}
        values["HAS_SCALE"] = False
        if int4:  # o's rows as int4 rows in groups of 128
            kinds["w_ptr"] = "*u8"
            block_g, split_x = int4_steps(block_n, warps, 2048, 16)
            values.update(GROUP=128, BLOCK_G4=block_g, SPLIT_X=split_x)
    values = {"sm": 1, **values}  # as a launch specializes a stride of 1
    made = sm90_compiled(kernel, kinds, values, warps, ATTENTION_STRIDES, **options)
    ptx = made.asm["ptx"]
    # the global loads between waits (the joined kernel has one wait a branch)
    loads = [part.count("ld.global") for part in ptx.split("griddepcontrol.wait")]
    regs, spills = ptxas_report(ptx)
    return regs, spills, made.metadata.shared, loads, ptx.count("cp.async")


def main() -> None:
    found = [(name, change, False) for name, change in CHANGES.items()]
    found += [(f"int4 {name}", change, True) for name, change in INT4_CHANGES.items()]
    for name, change, int4 in found:
        regs, spills, shared, loads, copies = compiled(*change, int4=int4)
        print(f"{name:53s} registers {regs:3d}, spilled {spills:4d} B, shared {shared:6d} B, "
              f"global loads between waits {loads}, cp.async {copies}", flush=True)


if __name__ == "__main__":
    main()
