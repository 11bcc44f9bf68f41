"""The int8 kernels beyond the one-block rows with their rows read as int32 words (each
weight fp32 by one byte permute and one fp32 subtract, no I2F: int8_words_triton.py's
pieces), each behind its kernel's WORDS constexpr (words_chosen: off by default): down's
split along K, o's rows in the attention + o launch, the head with its token.

    python bench/int8_words_rest.py [--chain]      (without a GPU)

compiles each ``_gdc`` kernel at the ~1.1B int8 step's shape for sm_90a both ways and
prints registers and instructions a weight by class (bench/int8_cvt_rows.py's count;
o's kernel holds the attention's code too, the same both ways); ``--chain`` prints
decode_chain_cuda.py's ``--int8 --variants`` list of words_variants.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# the ~1.1B int8 step: (rows, columns) of down, o and the head; o's attention: 32 heads
# over 4, 64 wide, 512 slots
DOWN, O, HEAD = (2048, 5632), (2048, 2048), (32000, 2048)


def _split(words: bool):
    from bench.int4_rows_ptx import sm90_compiled
    from targets.aoti.kernels.split_gemv_triton import split_config, split_gemv_kernel_gdc
    block_n, block_k, warps, ahead, split = split_config(DOWN[1])
    values = dict(N=DOWN[0], K=DOWN[1], HAS_BIAS=False, HAS_RES=True, HAS_SCALE=True,
                  SPLIT=split, PART=-(-DOWN[1] // split), BLOCK_N=block_n, BLOCK_K=block_k,
                  AHEAD=ahead, W_AHEAD=True, WORDS=words, PRMT=True)
    kinds = {"w_ptr": "*i8", "part_ptr": "*fp32", "counts_ptr": "*i32"}
    weights = block_n * values["PART"] / (32 * warps)
    return sm90_compiled(split_gemv_kernel_gdc, kinds, values, warps), weights


def _attention_o(words: bool):
    from bench.int4_rows_ptx import ATTENTION_STRIDES, sm90_compiled
    from targets.aoti.kernels import attention_o_triton as ao
    from targets.aoti.kernels.attention_o_slots import attention_splits
    splits = attention_splits(True)
    values = dict(SCALE=0.125, S=512, D=64, G=8, KVH=4, SPLITS=splits,
                  BLOCK_S=max(16, 512 // splits), BLOCK_G=16, BLOCK_D=64, IEEE=False,
                  JOIN_G=8, BLOCK_J=8, N=O[0], K=O[1], BLOCK_N=ao.ROWS, HAS_SCALE=True,
                  POLL=1, CACHE_AHEAD=True, WORDS=words, PRMT=True, sm=1)
    values.update({name: 0 for name in ("GROUP", "BLOCK_G4")
                   if name in ao.attention_o_store_kernel_gdc.arg_names})
    kinds = {name: "*fp32" for name in ("m_ptr", "l_ptr", "acc_ptr")}
    kinds.update(counts_ptr="*i32", flags_ptr="*i32", w_ptr="*i8", pos_ptr="*i64")
    weights = ao.ROWS * O[1] / (32 * 4)  # an o program's: 4 rows, 4 warps
    return sm90_compiled(ao.attention_o_store_kernel_gdc, kinds, values, 4,
                         ATTENTION_STRIDES + ("slot", "reset")), weights


def _head(words: bool):
    from bench.int4_rows_ptx import sm90_compiled
    from targets.aoti.kernels.head_argmax_triton import head_argmax_kernel_gdc
    from targets.aoti.kernels.triton_kernels import gemv_config
    block_n, block_k, warps, ahead = gemv_config(*HEAD, False, True, 1, 132)[:4]
    values = dict(EPS=1e-5, OFFSET=0.0, N=HEAD[0], K=HEAD[1], HAS_BIAS=False,
                  HAS_NORM=True, HAS_SCALE=True, BLOCK_N=block_n, BLOCK_K=block_k,
                  AHEAD=ahead, W_AHEAD=True, WORDS=words, PRMT=True)
    kinds = {"w_ptr": "*i8", "slot_ptr": "*i64"}
    weights = block_n * HEAD[1] / (32 * warps)
    return sm90_compiled(head_argmax_kernel_gdc, kinds, values, warps), weights


# name -> (compile, its forms: WORDS values); o's 2: its words made fp32 before its spin
KERNELS = {"down (split_gemv_kernel_gdc)": (_split, (0, 1)),
           "o (attention_o_store_kernel_gdc)": (_attention_o, (0, 1, 2)),
           "head (head_argmax_kernel_gdc)": (_head, (0, 1))}
FORMS = {0: "I2F", 1: "words", 2: "words ahead"}


def after_spin(text: str) -> str:
    """What a thread of o's issues after its spin on the attention (the launch's path
    once the attention is done): SASS instructions after the poll's NANOSLEEP, and of
    them the I2F, PRMT and FADD."""
    import re
    ops = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text,
                     re.M)
    after = ops[ops.index("NANOSLEEP") + 1:]
    kinds = {kind: sum(op.startswith(kind) for op in after) for kind in ("I2F", "PRMT",
                                                                          "FADD")}
    return f"after the spin {len(after)} ({', '.join(f'{k} {v}' for k, v in kinds.items())})"


def report(name: str) -> list[str]:
    """A line a form, I2F first: registers and instructions a weight by class (o's: and
    what it issues after its spin)."""
    from bench.int4_rows_ptx import ptxas_report
    from bench.int8_cvt_rows import CLASSES, class_counts, sass
    lines = []
    compile_, forms = KERNELS[name]
    for words in forms:
        compiled, weights = compile_(words)
        text = sass(compiled)
        counts = class_counts(text)
        lines.append(f"  {FORMS[words]:5s} regs "
                     f"{ptxas_report(compiled.asm['ptx'])[0]:3d}  " + "  ".join(
                         f"{c} {counts.get(c, 0) / weights:.2f}" for c in CLASSES)
                     + f"  ({weights:.0f} weights a thread)"
                     + (f"; {after_spin(text)}" if compile_ is _attention_o else ""))
    return lines


class LibraryAttentionO:
    """decode_chain_cuda.step's ``configs["attention_o"]``: the library's attention + o
    launch that stores the step's K/V rows (as an int8 build runs it), o's rows
    converted by I2F (``words`` 0) or read as words, made fp32 after the spin (1) or
    before it (2). Plain launches answer None (the chain's own
    attention and o: the bench's reference). The new rows go to slot POSITION, a masked
    one of the chain's cache, so every replay computes the same."""

    POSITION = 500

    def __init__(self, words: int):
        self.words, self.state = int(words), {}

    def __repr__(self) -> str:
        return f"library attention-o store{['', ' words', ' words ahead'][self.words]}"

    def __call__(self, q, k, v, h, layer: dict, made: dict, pdl: bool):
        from targets.aoti.kernels.attention_o_slots import SLOTS, STRIDE, flag_slots
        from targets.aoti.kernels.attention_o_triton import launch_decode_attention_o
        if not pdl:
            return None
        if not self.state:  # made on the first (uncaptured) call, shared by all layers
            self.state = dict(
                counts=torch.zeros(k.shape[1], dtype=torch.int32, device=q.device),
                flags=torch.zeros(SLOTS * STRIDE, dtype=torch.int32, device=q.device),
                positions=torch.full((1,), self.POSITION, dtype=torch.int64,
                                     device=q.device))
        index = next(i for i, each in enumerate(made["layers"]) if each is layer)
        slot, reset = flag_slots(len(made["layers"]))[index]
        weight, scale = layer["o"]
        return launch_decode_attention_o(
            q, layer["k"], k, layer["v"], v, made["mask"], q.shape[-1] ** -0.5, True,
            self.state["counts"], weight, scale, h, self.state["flags"], slot, reset,
            self.state["positions"], pdl, words=self.words)


class WordsHead:
    """decode_chain_cuda.step's ``configs["head"]``: the library's head with its token
    (launch_head_argmax, as a greedy int8 step ends), ``words`` or I2F; its slot and
    token made on the first (uncaptured) call, which checks the token."""

    def __init__(self, config: tuple, words: bool):
        self.config, self.words, self.slot, self.token = config, words, None, None

    def __repr__(self) -> str:
        return f"head argmax{self.config}{' words' if self.words else ''}"

    def __call__(self, x, weight, scale, fold: dict, pdl: bool) -> torch.Tensor:
        from targets.aoti.kernels.head_argmax_triton import argmax_slot, launch_head_argmax
        if self.slot is None:
            self.slot = argmax_slot(x.device)
            self.token = torch.zeros(1, dtype=torch.int64, device=x.device)
        logits, _ = launch_head_argmax(x, weight, None, fold.get("norm"), 1e-5, 0.0, scale,
                                       self.config, pdl, self.slot, self.token,
                                       words=self.words)
        if x.device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
            if int(self.token) != int(logits.reshape(-1).argmax()):
                raise RuntimeError(f"{self!r}: token {int(self.token)} is not the argmax")
        return logits


# name -> {product: (kind, words)}: each kernel's words form beside its I2F twin, the
# form an int8 build runs now (down's twin is the base's own down: the library split)
CHANGES = {
    "nothing changed": {},  # the base again: the spread between two equal graphs
    "words down": {"down": ("split", 1)},
    "library attention-o": {"attention_o": ("attention_o", 0)},
    "library attention-o words": {"attention_o": ("attention_o", 1)},
    "library attention-o words ahead": {"attention_o": ("attention_o", 2)},
    "head argmax": {"head": ("head", 0)},
    "head argmax words": {"head": ("head", 1)},
    "library attention-o + head argmax": {"attention_o": ("attention_o", 0),
                                          "head": ("head", 0)},
    "all words": {"down": ("split", 1), "attention_o": ("attention_o", 1),
                  "head": ("head", 1)},
    "all words ahead": {"down": ("split", 1), "attention_o": ("attention_o", 2),
                        "head": ("head", 1)},
}


def _launch(kind: str, words: int, configs: dict):
    from bench.decode_chain_split import SplitLaunch
    if kind == "split":
        return SplitLaunch((*configs["down"][:4], configs["down"][6]), words)
    if kind == "head":
        return WordsHead(tuple(configs["head"][:4]), words)
    return LibraryAttentionO(words)


def words_variants(bases: dict) -> dict:
    """decode_chain_cuda.variants()'s ``--int8`` entries: each base (name -> its variant
    tuple) with CHANGES' kernels (each variant its own launches and buffers)."""
    return {f"{base} + {name}": (pdl, {**configs, **{
        product: _launch(kind, words, configs) for product, (kind, words) in changes.items()}},
        *rest) for base, (pdl, configs, *rest) in bases.items()
        for name, changes in CHANGES.items()}


# the base a library runs now: the layer's attention and o in one launch
BASE = "dependent + join + attention-o joined 8 splits 4 rows"


def chain_names(base: str = BASE) -> list[str]:
    """A ``--variants`` list: ``base``, then it with each change, "nothing changed" last."""
    names = [name for name in CHANGES if name != "nothing changed"] + ["nothing changed"]
    return [base] + [f"{base} + {name}" for name in names]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chain", action="store_true",
                        help="print the --variants list for decode_chain_cuda.py --int8")
    if parser.parse_args().chain:
        print(",".join(chain_names()))
        return
    import triton

    from bench.int8_cvt_rows import CLASSES
    print(f"triton {triton.__version__}, sm_90a; instructions a weight (whole kernel, "
          f"unrolled) by class: {', '.join(CLASSES)}")
    for name in KERNELS:
        print(name, flush=True)
        for line in report(name):
            print(line, flush=True)


if __name__ == "__main__":
    main()
