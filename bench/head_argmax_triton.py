"""The head's product with the greedy token taken inside it, timed: the library's kernel
(targets/aoti/kernels/head_argmax_triton.py, the ``row_gemv_argmax`` op a greedy decode
step ends with) against row_gemv then torch's argmax (the runtime's greedy_tail).

    python bench/head_argmax_triton.py [--rounds 15]

On a GPU: the ~1.1B's head (32,000 x 2,048 fp16, final norm folded) as a dependent
launch, in one CUDA graph each, in turns: row_gemv then the runtime's greedy_tail
(torch.argmax into the token, the position's add), against the library's head and its
token kernel, then the add; each token checked against torch.argmax.
Without a GPU: the ``_gdc`` forms compiled for sm_90a, registers beside row_gemv's.
The 22-layer chain's variants: ``argmax_variants`` (bench/decode_chain_cuda.py).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from targets.aoti.kernels.head_argmax_triton import (argmax_slot,  # noqa: E402
                                                     head_argmax_kernel_gdc,
                                                     launch_head_argmax)
from targets.aoti.kernels.triton_kernels import gemv_config  # noqa: E402


class HeadArgmax:
    """decode_chain_cuda's head as a launch of its own that ends with the token and the
    position's add: ``fused``: the library's kernel (its slot made once and kept, as a
    loop of steps keeps it; the token written straight into the step's input), else
    row_gemv then the runtime's greedy_tail (torch.argmax). Its buffers are made on the
    first (uncaptured) call; an uncaptured call checks the token against torch.argmax
    of the logits."""

    def __init__(self, config: tuple | None, fused: bool, x_qblock: int = 0):
        # x_qblock: int8 rows against x's int8 codes (the fused kernel's; None: its choice)
        self.config, self.fused, self.x_qblock = config, fused, x_qblock
        self.slot = self.token = self.position = None

    def __call__(self, x, weight, scale, fold: dict, pdl: bool) -> torch.Tensor:
        from runtime.generation.decode_graph import greedy_tail
        from targets.aoti.kernels.triton_kernels import launch_row_gemv
        if self.slot is None:
            self.slot = argmax_slot(x.device)
            self.token = torch.zeros(1, dtype=torch.int64, device=x.device)
            self.position = torch.zeros(1, dtype=torch.int64, device=x.device)
        norm = fold.get("norm")
        if not self.fused:
            logits = launch_row_gemv(x, weight, None, norm, None, 1e-5, 0.0, 0,
                                     self.config, pdl, scale)
            greedy_tail(logits.reshape(1, -1), self.token, self.position)
        else:
            logits, _ = launch_head_argmax(x, weight, None, norm, 1e-5, 0.0, scale,
                                           self.config, pdl, self.slot, self.token,
                                           x_qblock=self.x_qblock)
            self.position.add_(1)
        if x.device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
            want = int(logits.reshape(-1).argmax())
            if int(self.token) != want:
                raise RuntimeError(f"{self!r}: token {int(self.token)}, argmax {want}")
        return logits

    def __repr__(self) -> str:  # the row's "configs" in the bench's JSON
        codes = f" x codes q{self.x_qblock}" if self.x_qblock else ""
        return f"{'head argmax' if self.fused else 'row_gemv + greedy_tail'}{self.config}{codes}"


def argmax_variants(default: dict) -> dict:
    """decode_chain_cuda.variants()'s entries: "dependent + join" ending with the token
    and the position's add: torch's argmax (the runtime's greedy_tail) or the head's."""
    head = default["head"][:4]
    tails = {"torch argmax": HeadArgmax(head, False), "head argmax": HeadArgmax(head, True)}
    return {f"dependent + join + {name}": (True, {**default, "head": tail}, None, True)
            for name, tail in tails.items()}


VOCAB, HIDDEN = 32000, 2048


def compiled_registers() -> dict:
    """Without a GPU: ptxas's registers a thread of the ``_gdc`` head kernels (the ~1.1B's
    head as a dependent launch configures it), and whether the 64-bit atomic max is in
    the PTX."""
    from bench.int4_rows_ptx import registers, sm90_ptx
    from targets.aoti.kernels.triton_kernels import row_gemv_kernel_gdc
    block_n, block_k, warps, ahead = gemv_config(VOCAB, HIDDEN, False, True, 2, 132)
    shape = dict(EPS=1e-5, OFFSET=0.0, N=VOCAB, K=HIDDEN, HAS_BIAS=False, HAS_NORM=True,
                 HAS_SCALE=False, BLOCK_N=block_n, BLOCK_K=block_k, AHEAD=ahead,
                 W_AHEAD=True)
    found = {"config": (block_n, block_k, warps, ahead)}
    plain = sm90_ptx(row_gemv_kernel_gdc, {}, dict(
        shape, ACT=0, HAS_RES=False, TILE_X=False, ROT_ROWS=0, HEAD_D=0), warps)
    found["row_gemv_kernel_gdc"] = registers(plain)
    ptx = sm90_ptx(head_argmax_kernel_gdc, {"slot_ptr": "*i64"}, shape, warps)
    found["head_argmax_kernel_gdc"] = registers(ptx)
    # a reduction (no value returned) where ptxas makes one of the unused atomic
    found["64-bit atomic max"] = re.findall(r"(?:atom|red)\.global\S*max\.s64", ptx)
    return found


def timed(rounds: int) -> None:
    """On a GPU: the head and its tail, each form one CUDA graph, in turns."""
    from bench.decode_kernels_microbench import taking_turns
    torch.manual_seed(0)
    x = torch.randn(1, 1, HIDDEN, device="cuda", dtype=torch.float16)
    w = torch.randn(VOCAB, HIDDEN, device="cuda", dtype=torch.float16) * 0.02
    norm = torch.rand(HIDDEN, device="cuda", dtype=torch.float16) + 0.5
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    calls = {}
    for pdl in (True, False):
        config = gemv_config(VOCAB, HIDDEN, False, pdl, 2, sms)[:4]
        form = "dependent" if pdl else "plain"
        for name, head in {"row_gemv + greedy_tail": HeadArgmax(config, False),
                           "head argmax + add": HeadArgmax(config, True)}.items():
            calls[f"{form}: {name}"] = (lambda head=head, pdl=pdl: head(
                x, w, None, {"norm": norm}, pdl))
        calls[f"{form}: row_gemv alone"] = (
            lambda pdl=pdl, config=config: _row_gemv_alone(x, w, norm, config, pdl))
    for name, us in taking_turns(calls, rounds).items():
        print(f"in turns, {rounds} rounds: {name:44s} {us:7.2f} us", flush=True)


def _row_gemv_alone(x, w, norm, config, pdl):
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    return launch_row_gemv(x, w, None, norm, None, 1e-5, 0.0, 0, config, pdl)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    if torch.cuda.is_available():
        timed(args.rounds)
    else:
        for name, value in compiled_registers().items():
            print(f"{name:44s} {value}", flush=True)


if __name__ == "__main__":
    main()
