"""The head's product with the greedy token taken inside it: row_gemv's kernel
(targets/aoti/kernels/triton_kernels.py's _row_gemv) over the vocabulary's rows, then
an epilogue that takes the argmax of the logits it stores, so the step needs no argmax
kernel after the head (torch's: one 9.2 us reduction, a plain launch that waits for the
head to drain).

Each program finds its rows' (max, first index) as one 64-bit key: the logit's
order-preserving integer bits in the high half, the index's complement in the low half,
so the larger key is the larger logit and, of equal logits, the first index (as
torch.argmax). It merges its key into one global slot with an atomic max, then counts
itself in; the last program to count in writes the token (int64) from the slot and sets
slot and count back to their start, so one ``argmax_state`` buffer serves every call
(split_gemv_triton.py's join). The key is taken from the logit as stored (fp16 or
fp32), so the token is torch.argmax of the logits the kernel returns. NaN: torch.argmax
takes the first NaN as the max; every NaN gets the largest key here, so the same. -0.0
counts as +0.0, as torch compares them. With ADVANCE the last program also adds one to
the position (the greedy tail's other kernel).

    python bench/head_argmax_triton.py [--rounds 15]

On a GPU: the ~1.1B's head (32,000 x 2,048 fp16, final norm folded) as a dependent
launch, in one CUDA graph each, in turns: row_gemv then the runtime's greedy_tail
(torch.argmax into the token, the position's add), against this kernel then the add,
and this kernel advancing the position too; each token checked against torch.argmax.
Without a GPU: the ``_gdc`` forms compiled for sm_90a, registers beside row_gemv's.
The 22-layer chain's variants: ``argmax_variants`` (bench/decode_chain_cuda.py).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from targets.aoti.kernels.dependent_launch import (declare_writes,  # noqa: E402
                                                   dependent_launch_here, launcher)
from targets.aoti.kernels.triton_kernels import _row_gemv, gemv_config  # noqa: E402

# the slot's start: below every logit's key (a masked row's key too)
_LOWEST = tl.constexpr(-(2 ** 63))
_LOW_HALF = tl.constexpr(2 ** 32 - 1)


@triton.jit
def _keys(y, rows, row_ok):
    """Each row's 64-bit key: the logit's order-preserving int32 bits (NaN the largest,
    -0.0 as +0.0) above the row index's complement; rows past N the lowest key."""
    y = tl.where(y == 0.0, 0.0, y).to(tl.float32)
    bits = y.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # negatives: larger bits, smaller
    key = tl.where(y != y, 0x7FFFFFFF, key)
    low = tl.full(rows.shape, _LOW_HALF, tl.int64) - rows.to(tl.int64)
    packed = (key.to(tl.int64) << 32) | low
    return tl.where(row_ok, packed, tl.full(rows.shape, _LOWEST, tl.int64))


@triton.jit
def _take_token(y, rows, row_ok, state_ptr, token_ptr, pos_ptr, ADVANCE: tl.constexpr):
    """The argmax epilogue: this program's key into the slot (state[0]), counted in on
    state[1]; the last to count in writes the token and puts the state back."""
    best = tl.max(_keys(y, rows, row_ok), axis=0)
    tl.atomic_max(state_ptr, best, sem="relaxed", scope="gpu")
    # the max before the count: the count's release then covers it
    tl.debug_barrier()
    seen = tl.atomic_add(state_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if seen == tl.num_programs(0) - 1:
        # every program merged its key: read the slot and set it back in one
        slot = tl.atomic_xchg(state_ptr, _LOWEST, sem="acq_rel", scope="gpu")
        low = slot - ((slot >> 32) << 32)
        tl.store(token_ptr, _LOW_HALF - low)
        tl.atomic_xchg(state_ptr + 1, 0, sem="relaxed", scope="gpu")
        if ADVANCE:
            tl.store(pos_ptr, tl.load(pos_ptr) + 1)


@triton.jit
def _head_argmax(x_ptr, w_ptr, b_ptr, nw_ptr, s_ptr, out_ptr, state_ptr, token_ptr,
                 pos_ptr, EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                 K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr,
                 HAS_SCALE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 AHEAD: tl.constexpr, GDC: tl.constexpr, W_AHEAD: tl.constexpr,
                 ADVANCE: tl.constexpr):
    # no residual, gate or rotary rows: their pointers are unused (compiled out)
    rows, y = _row_gemv(x_ptr, w_ptr, b_ptr, nw_ptr, x_ptr, s_ptr, x_ptr, x_ptr, EPS,
                        OFFSET, N, K, HAS_BIAS, HAS_NORM, 0, False, HAS_SCALE, BLOCK_N,
                        BLOCK_K, AHEAD, GDC, W_AHEAD, False, 0, 0)
    row_ok = rows < N
    stored = y.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows, stored, mask=row_ok)
    _take_token(stored, rows, row_ok, state_ptr, token_ptr, pos_ptr, ADVANCE)


@triton.jit
def head_argmax_kernel(x_ptr, w_ptr, b_ptr, nw_ptr, s_ptr, out_ptr, state_ptr, token_ptr,
                       pos_ptr, EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                       K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr,
                       HAS_SCALE: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, AHEAD: tl.constexpr,
                       ADVANCE: tl.constexpr = False):
    """row_gemv's head and the token, started as a plain launch."""
    _head_argmax(x_ptr, w_ptr, b_ptr, nw_ptr, s_ptr, out_ptr, state_ptr, token_ptr,
                 pos_ptr, EPS, OFFSET, N, K, HAS_BIAS, HAS_NORM, HAS_SCALE, BLOCK_N,
                 BLOCK_K, AHEAD, False, False, ADVANCE)


@triton.jit
def head_argmax_kernel_gdc(x_ptr, w_ptr, b_ptr, nw_ptr, s_ptr, out_ptr, state_ptr,
                           token_ptr, pos_ptr, EPS: tl.constexpr, OFFSET: tl.constexpr,
                           N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                           HAS_NORM: tl.constexpr, HAS_SCALE: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           AHEAD: tl.constexpr, W_AHEAD: tl.constexpr,
                           ADVANCE: tl.constexpr = False):
    """The same as a programmatic dependent launch (row_gemv_kernel_gdc's wait)."""
    _head_argmax(x_ptr, w_ptr, b_ptr, nw_ptr, s_ptr, out_ptr, state_ptr, token_ptr,
                 pos_ptr, EPS, OFFSET, N, K, HAS_BIAS, HAS_NORM, HAS_SCALE, BLOCK_N,
                 BLOCK_K, AHEAD, True, W_AHEAD, ADVANCE)


# not state_ptr: the kernel leaves it at its start (split_gemv_triton.py's counters)
declare_writes(head_argmax_kernel_gdc, "out_ptr", "token_ptr", "pos_ptr")


def argmax_state(device) -> torch.Tensor:
    """The buffer the kernel merges into and leaves at its start: [slot, count]."""
    return torch.tensor([_LOWEST.value, 0], dtype=torch.int64, device=device)


def launch_head_argmax(x, weight, norm_weight, eps: float, offset: float,
                       state: torch.Tensor, token: torch.Tensor, config: tuple | None = None,
                       pdl: bool = False, bias=None, weight_scale=None,
                       position: torch.Tensor | None = None) -> torch.Tensor:
    """reference.row_gemv(x, weight, bias, norm_weight, None, eps, offset, 0,
    weight_scale) (the logits, returned) and their argmax written into ``token`` (int64,
    one element); ``state``: argmax_state's buffer, left at its start; ``position``
    (int64, one element): advanced by one after the token is written. ``config``:
    gemv_config's (BLOCK_N, BLOCK_K, num_warps, AHEAD); by default its choice."""
    rows, cols = weight.shape
    if state.dtype != torch.int64 or state.numel() != 2:
        raise ValueError(f"state: argmax_state's 2 int64, got {state.numel()} {state.dtype}")
    if token.dtype != torch.int64 or token.numel() != 1:
        raise ValueError(f"token: one int64, got {token.numel()} {token.dtype}")
    gdc = dependent_launch_here(x.device) and pdl
    block_n, block_k, warps, ahead = (config or gemv_config(
        rows, cols, False, gdc, weight.element_size()))[:4]
    out = torch.empty((*x.shape[:-1], rows), dtype=x.dtype, device=x.device)
    launch, gdc = launcher(head_argmax_kernel, head_argmax_kernel_gdc, x.device, pdl)
    dummy = weight  # an unused pointer argument (its branch is compiled out)
    weights_first = dict(W_AHEAD=weight.is_contiguous()) if gdc else {}
    launch((triton.cdiv(rows, block_n),))(
        x.reshape(cols), weight.contiguous(), dummy if bias is None else bias,
        dummy if norm_weight is None else norm_weight,
        dummy if weight_scale is None else weight_scale.reshape(-1), out, state, token,
        token if position is None else position,
        EPS=eps, OFFSET=offset, N=rows, K=cols, HAS_BIAS=bias is not None,
        HAS_NORM=norm_weight is not None, HAS_SCALE=weight_scale is not None,
        BLOCK_N=block_n, BLOCK_K=block_k, AHEAD=ahead, ADVANCE=position is not None,
        num_warps=warps, **weights_first)
    return out


class HeadArgmax:
    """decode_chain_cuda's head as a launch of its own that ends with the token:
    ``fused``: this kernel (``advance``: the position advanced inside it, else by
    torch's add after); else row_gemv then the runtime's greedy_tail (torch.argmax).
    Its buffers are made on the first (uncaptured) call; an uncaptured call checks the
    token against torch.argmax of the logits."""

    def __init__(self, config: tuple, fused: bool, advance: bool = False):
        self.config, self.fused, self.advance = config, fused, advance
        self.state = self.token = self.position = None

    def __call__(self, x, weight, scale, fold: dict, pdl: bool) -> torch.Tensor:
        from runtime.generation.decode_graph import greedy_tail
        from targets.aoti.kernels.triton_kernels import launch_row_gemv
        if self.state is None:
            self.state = argmax_state(x.device)
            self.token = torch.zeros(1, dtype=torch.int64, device=x.device)
            self.position = torch.zeros(1, dtype=torch.int64, device=x.device)
        norm = fold.get("norm")
        if not self.fused:
            logits = launch_row_gemv(x, weight, None, norm, None, 1e-5, 0.0, 0,
                                     self.config, pdl, scale)
            greedy_tail(logits.reshape(1, -1), self.token, self.position)
        else:
            logits = launch_head_argmax(x, weight, norm, 1e-5, 0.0, self.state, self.token,
                                        self.config, pdl, weight_scale=scale,
                                        position=self.position if self.advance else None)
            if not self.advance:
                self.position.add_(1)
        if x.device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
            want = int(logits.reshape(-1).argmax())
            if int(self.token) != want:
                raise RuntimeError(f"{self!r}: token {int(self.token)}, argmax {want}")
        return logits

    def __repr__(self) -> str:  # the row's "configs" in the bench's JSON
        form = "head argmax" + (" and position" if self.advance else "")
        return f"{form if self.fused else 'row_gemv + greedy_tail'}{self.config}"


def argmax_variants(default: dict) -> dict:
    """decode_chain_cuda.variants()'s entries: "dependent + join" ending with the token
    and the position's add, by torch (the runtime's greedy_tail) or in the head."""
    head = default["head"][:4]
    tails = {"torch argmax": HeadArgmax(head, False),
             "head argmax": HeadArgmax(head, True),
             "head argmax and position": HeadArgmax(head, True, advance=True)}
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
    kinds = {name: "*i64" for name in ("state_ptr", "token_ptr", "pos_ptr")}
    for advance in (False, True):
        ptx = sm90_ptx(head_argmax_kernel_gdc, kinds, dict(shape, ADVANCE=advance), warps)
        name = "head_argmax_kernel_gdc" + (", ADVANCE" if advance else "")
        found[name] = registers(ptx)
        found[name + ": 64-bit atomic max"] = bool(re.search(r"atom\.global\S*max\.s64", ptx))
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
                           "head argmax + add": HeadArgmax(config, True),
                           "head argmax and position": HeadArgmax(config, True, True)}.items():
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
