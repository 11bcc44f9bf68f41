"""A layer's attention and o (+ residual) as one launch in decode_chain_cuda.py's chain
(``configs["attention_o"]``): the library's launch (targets/aoti/kernels/
attention_o_triton.py, the kernel of the ``decode_attention_o`` op a build runs) at the
blocks of slots a key/value head, o's rows a program and warps that a variant names.

The chain's bases are "dependent + join + attention-o joined 4 splits 4 rows" (fp16 and,
with ``int4`` before it, int4 rows) and "... 8 splits 4 rows" (int8 rows): the library's
own configuration (attention_splits, ROWS, 4 warps). Each base also comes "+ nothing
changed" (the base again, a graph of its own: the spread between two equal graphs) and
"+ K/V rows stored" (the store form a build runs: the step's new rows written into the
cache's last slot, which the chain's mask hides, so every replay reads the same cache).

What each configuration measured in the 22-layer chain, and the fused form (o split by
key/value head) that lost: bench/RESULTS.md, sessions 75, 76 and 79. The registers of the
library's kernel compiled for sm_90a: bench/int4_fused_ptx.py.
"""

from __future__ import annotations

import torch

# name -> (blocks of slots a key/value head, o's rows a program, warps)
CHANGES = {
    "attention-o joined 16 splits 2 rows": (16, 2, 4),
    "attention-o joined 16 splits 4 rows": (16, 4, 4),
    "attention-o joined 16 splits 8 rows": (16, 8, 4),
    "attention-o joined 16 splits 4 rows 8 warps": (16, 4, 8),
    "attention-o joined 16 splits 8 rows 8 warps": (16, 8, 8),
    "attention-o joined 8 splits 4 rows": (8, 4, 4),
    "attention-o joined 4 splits 2 rows": (4, 2, 4),
    "attention-o joined 4 splits 4 rows": (4, 4, 4),
    "attention-o joined 4 splits 8 rows": (4, 8, 4),
}
# the chain's bases: fp16 and int4 rows, int8 rows (the library's configurations)
BASES = ("attention-o joined 4 splits 4 rows", "attention-o joined 8 splits 4 rows")


class AttentionO:
    """decode_chain_cuda.step's ``configs["attention_o"]``: (q, k, v, h, layer, made,
    pdl) -> o, the library's launch at ``config`` (blocks of slots, rows a program,
    warps); ``store``: its store form, the new rows at the cache's last slot. Plain
    launches answer None (the chain's own attention and o: the bench's reference),
    unless ``own_plain`` (under Triton's interpreter)."""

    def __init__(self, *config: int, store: bool = False, own_plain: bool = False):
        self.config, self.store, self.own_plain = config, store, own_plain
        self.state: dict = {}

    def __repr__(self) -> str:  # the row's "configs" in the bench's JSON
        return f"attention-o {'store ' if self.store else ''}{self.config}"

    def _buffers(self, past: torch.Tensor) -> dict:
        from targets.aoti.kernels.attention_o_slots import SLOTS, STRIDE
        if not self.state:  # made on the first (uncaptured) call, shared by all layers
            device = past.device
            self.state = {
                "counts": torch.zeros(past.shape[1], dtype=torch.int32, device=device),
                "flags": torch.zeros(SLOTS * STRIDE, dtype=torch.int32, device=device),
                "positions": torch.full((1,), past.shape[2] - 1, dtype=torch.int64,
                                        device=device)}
        return self.state

    def __call__(self, q, k, v, h, layer: dict, made: dict, pdl: bool):
        from targets.aoti.kernels.attention_o_slots import flag_slots
        from targets.aoti.kernels.attention_o_triton import launch_decode_attention_o
        if not pdl and not self.own_plain:
            return None
        state = self._buffers(layer["k"])
        index = next(i for i, each in enumerate(made["layers"]) if each is layer)
        slot, reset = flag_slots(len(made["layers"]))[index]
        weight, scale = layer["o"]
        return launch_decode_attention_o(
            q, layer["k"], k, layer["v"], v, made["mask"], q.shape[-1] ** -0.5, True,
            state["counts"], weight, scale, h, state["flags"], slot, reset,
            state["positions"] if self.store else None, pdl, self.config)


def _variants(prefix: str, entry: tuple, bases: tuple) -> dict:
    """``entry`` (pdl, configs, *launch options) with each change's launch, and each
    base's "+ nothing changed" and "+ K/V rows stored"."""
    pdl, configs, *rest = entry

    def with_launch(launch: AttentionO) -> tuple:
        return (pdl, {**configs, "attention_o": launch}, *rest)
    found = {f"{prefix}{name}": with_launch(AttentionO(*config))
             for name, config in CHANGES.items()}
    for name in bases:
        found[f"{prefix}{name} + nothing changed"] = with_launch(AttentionO(*CHANGES[name]))
        found[f"{prefix}{name} + K/V rows stored"] = with_launch(
            AttentionO(*CHANGES[name], store=True))
    return found


def attention_o_variants(default: dict) -> dict:
    """decode_chain_cuda.variants()'s entries: "dependent + join" with a layer's attention
    and o as one launch."""
    return _variants("dependent + join + ", (True, default, None, True), BASES)


def attention_o_int4_variants(int4_chosen: dict) -> dict:
    """decode_chain_int4.int4_variants()'s entries for ``--int4``: "int4 dependent +
    join" (from ``int4_chosen``) with a layer's attention and o as one launch."""
    return _variants("int4 dependent + join + ", int4_chosen["int4 dependent + join"],
                     BASES[:1])
