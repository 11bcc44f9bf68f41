"""The head's product with the greedy token taken inside it (``row_gemv_argmax``):
row_gemv's kernel (triton_kernels.py's _row_gemv) over the vocabulary's rows, then an
epilogue that takes the argmax of the logits it stores, so a greedy decode step needs no
argmax kernel after the head (torch's: one reduction, a plain launch that waits for the
head to drain).

Each program finds its rows' (max, first index) as one 64-bit key: the logit's
order-preserving integer bits, made non-negative, above the index's complement, so the
larger key is the larger logit and, of equal logits, the first index (as torch.argmax);
every logit's key is above zero. A program merges its key into one int64 slot with a
relaxed atomic max and is done: no count, no fence, no last program (a join's acquire
and release per program cost the head about 8 us in the ~1.1B). A small kernel after
the head (a dependent launch: it waits for the head to finish) turns the slot into the
token and sets it back to zero. The key is taken from the logit as stored (fp16 or
fp32), so the token is torch.argmax of the logits the kernel returns. NaN: torch.argmax
takes the first NaN as the max; every NaN gets the largest key here, so the same. -0.0
counts as +0.0, as torch compares them. Over int4 rows (int4_rows.py's format) the
product is int4_triton.py's kernel, with the same epilogue. A greedy step's advancing form
(``row_gemv_argmax_advance``) has the token kernel also write the token into the step's
input ids and add one to its position, in place: the decode graph's copy and add after
the step (two plain launches) are then gone.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from targets.aoti.kernels.dependent_launch import (declare_writes, dependent_launch_here,
                                                   launcher, library_launches_dependent)
from targets.aoti.kernels.int4_triton import _int4_row_gemv, int4_config
from targets.aoti.kernels.int8_words_triton import _word_rows, words_fit
from targets.aoti.kernels.row_parts import _block_rows
from targets.aoti.kernels.triton_kernels import _row_gemv, gemv_config

_LOW_MASK = tl.constexpr(2 ** 31 - 1)  # the index's complement: vocabularies below 2^31
_HALF = tl.constexpr(2 ** 31)  # lifts the signed order bits to 0 .. 2^32 - 1


@triton.jit
def _keys(y, rows, row_ok):
    """Each row's 64-bit key, above zero: the logit's order-preserving int32 bits (NaN the
    largest, -0.0 as +0.0) lifted to unsigned, above the row index's 31-bit complement;
    rows past N zero, the slot's start."""
    y = tl.where(y == 0.0, 0.0, y).to(tl.float32)
    bits = y.to(tl.int32, bitcast=True)
    order = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # negatives: larger bits, smaller
    order = tl.where(y != y, 0x7FFFFFFF, order)
    # -inf's order lifted is 2^23 - 1: every logit's key is above zero
    high = order.to(tl.int64) + tl.full(rows.shape, _HALF, tl.int64)
    low = tl.full(rows.shape, _LOW_MASK, tl.int64) - rows.to(tl.int64)
    packed = (high << 31) | low
    return tl.where(row_ok, packed, tl.zeros(rows.shape, tl.int64))


@triton.jit
def _merge_key(y, rows, row_ok, slot_ptr):
    """This program's largest key into the slot; nothing waits on it here."""
    tl.atomic_max(slot_ptr, tl.max(_keys(y, rows, row_ok), axis=0), sem="relaxed",
                  scope="gpu")


@triton.jit
def _head_argmax(x_ptr, w_ptr, b_ptr, nw_ptr, s_ptr, out_ptr, slot_ptr,
                 EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                 K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr,
                 HAS_SCALE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 AHEAD: tl.constexpr, GDC: tl.constexpr, W_AHEAD: tl.constexpr,
                 QBLOCK: tl.constexpr, PTX: tl.constexpr):
    # no residual, gate or rotary rows: their pointers are unused (compiled out)
    if QBLOCK:  # int8 rows against x's int8 codes (int8_words_triton's QBLOCK)
        rows = _block_rows(tl.program_id(0), BLOCK_N, 0, 0)
        if GDC:  # the next kernel may start as soon as every program here has
            tl.extra.cuda.gdc_launch_dependents()
        y = _word_rows(x_ptr, w_ptr, b_ptr, nw_ptr, x_ptr, s_ptr, x_ptr, x_ptr, rows,
                       rows < N, EPS, OFFSET, N, K, HAS_BIAS, HAS_NORM, 0, False, BLOCK_N,
                       BLOCK_K, AHEAD, GDC, W_AHEAD, 0, 0, PTX, QBLOCK)
    else:
        rows, y = _row_gemv(x_ptr, w_ptr, b_ptr, nw_ptr, x_ptr, s_ptr, x_ptr, x_ptr, EPS,
                            OFFSET, N, K, HAS_BIAS, HAS_NORM, 0, False, HAS_SCALE, BLOCK_N,
                            BLOCK_K, AHEAD, GDC, W_AHEAD, False, 0, 0)
    _store_logits(y, rows, N, out_ptr, slot_ptr)


@triton.jit
def _store_logits(y, rows, N: tl.constexpr, out_ptr, slot_ptr):
    """The rows' logits stored, and their largest key merged into the slot (the key of
    the value as stored: the token is the argmax of the logits returned)."""
    row_ok = rows < N
    stored = y.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows, stored, mask=row_ok)
    _merge_key(stored, rows, row_ok, slot_ptr)


@triton.jit
def _int4_head_argmax(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, out_ptr, slot_ptr,
                      EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                      K: tl.constexpr, GROUP: tl.constexpr, HAS_BIAS: tl.constexpr,
                      HAS_NORM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
                      SPLIT_X: tl.constexpr, GDC: tl.constexpr):
    # int4_triton's product (no residual, gate or rotary rows: pointers unused)
    rows, y = _int4_row_gemv(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, x_ptr, x_ptr, x_ptr, EPS,
                             OFFSET, N, K, GROUP, HAS_BIAS, HAS_NORM, 0, False, BLOCK_N,
                             BLOCK_G, GDC, 0, 0, SPLIT_X)
    _store_logits(y, rows, N, out_ptr, slot_ptr)


@triton.jit
def head_argmax_kernel(x_ptr, w_ptr, b_ptr, nw_ptr, s_ptr, out_ptr, slot_ptr,
                       EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                       K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr,
                       HAS_SCALE: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, AHEAD: tl.constexpr,
                       QBLOCK: tl.constexpr = 0, PTX: tl.constexpr = True):
    """row_gemv's head, each program's key merged into the slot; a plain launch."""
    _head_argmax(x_ptr, w_ptr, b_ptr, nw_ptr, s_ptr, out_ptr, slot_ptr, EPS, OFFSET, N, K,
                 HAS_BIAS, HAS_NORM, HAS_SCALE, BLOCK_N, BLOCK_K, AHEAD, False, False,
                 QBLOCK, PTX)


@triton.jit
def head_argmax_kernel_gdc(x_ptr, w_ptr, b_ptr, nw_ptr, s_ptr, out_ptr, slot_ptr,
                           EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                           K: tl.constexpr, HAS_BIAS: tl.constexpr,
                           HAS_NORM: tl.constexpr, HAS_SCALE: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           AHEAD: tl.constexpr, W_AHEAD: tl.constexpr,
                           QBLOCK: tl.constexpr = 0, PTX: tl.constexpr = True):
    """The same as a programmatic dependent launch (row_gemv_kernel_gdc's wait)."""
    _head_argmax(x_ptr, w_ptr, b_ptr, nw_ptr, s_ptr, out_ptr, slot_ptr, EPS, OFFSET, N, K,
                 HAS_BIAS, HAS_NORM, HAS_SCALE, BLOCK_N, BLOCK_K, AHEAD, True, W_AHEAD,
                 QBLOCK, PTX)


@triton.jit
def int4_head_argmax_kernel(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, out_ptr, slot_ptr,
                            EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                            K: tl.constexpr, GROUP: tl.constexpr, HAS_BIAS: tl.constexpr,
                            HAS_NORM: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_G: tl.constexpr, SPLIT_X: tl.constexpr):
    """The head over int4 rows (int4_triton.py's kernel), each program's key merged into
    the slot; a plain launch."""
    _int4_head_argmax(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, out_ptr, slot_ptr, EPS, OFFSET, N,
                      K, GROUP, HAS_BIAS, HAS_NORM, BLOCK_N, BLOCK_G, SPLIT_X, False)


@triton.jit
def int4_head_argmax_kernel_gdc(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, out_ptr, slot_ptr,
                                EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                                K: tl.constexpr, GROUP: tl.constexpr,
                                HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr,
                                BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
                                SPLIT_X: tl.constexpr):
    """The same as a programmatic dependent launch (int4_row_gemv_kernel_gdc's wait)."""
    _int4_head_argmax(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, out_ptr, slot_ptr, EPS, OFFSET, N,
                      K, GROUP, HAS_BIAS, HAS_NORM, BLOCK_N, BLOCK_G, SPLIT_X, True)


@triton.jit
def _slot_token(slot_ptr, token_ptr, ids_ptr, pos_ptr, GDC: tl.constexpr,
                ADVANCE: tl.constexpr):
    if GDC:  # the head, every program's key merged, before the slot is read
        tl.extra.cuda.gdc_wait()
    slot = tl.load(slot_ptr)
    if ADVANCE:  # loaded beside the slot: one round trip, not two
        position = tl.load(pos_ptr)
    token = _LOW_MASK - (slot & _LOW_MASK)
    tl.store(token_ptr, token)
    if ADVANCE:  # the next step's inputs: every reader of them ran before this wait
        tl.store(ids_ptr, token)
        tl.store(pos_ptr, position + 1)
    tl.store(slot_ptr, tl.zeros_like(slot))


@triton.jit
def slot_token_kernel(slot_ptr, token_ptr):
    """The token the slot's key names, the slot set back to zero; a plain launch."""
    _slot_token(slot_ptr, token_ptr, token_ptr, token_ptr, False, False)


@triton.jit
def slot_token_kernel_gdc(slot_ptr, token_ptr):
    """The same as a dependent launch: started as the head runs, it waits for it."""
    _slot_token(slot_ptr, token_ptr, token_ptr, token_ptr, True, False)


@triton.jit
def slot_token_advance_kernel(slot_ptr, token_ptr, ids_ptr, pos_ptr):
    """slot_token_kernel that also writes the token into the step's input ids and adds
    one to its position (the greedy loop's next inputs); a plain launch."""
    _slot_token(slot_ptr, token_ptr, ids_ptr, pos_ptr, False, True)


@triton.jit
def slot_token_advance_kernel_gdc(slot_ptr, token_ptr, ids_ptr, pos_ptr):
    """The same as a dependent launch."""
    _slot_token(slot_ptr, token_ptr, ids_ptr, pos_ptr, True, True)


declare_writes(head_argmax_kernel_gdc, "out_ptr", "slot_ptr")
declare_writes(int4_head_argmax_kernel_gdc, "out_ptr", "slot_ptr")
declare_writes(slot_token_kernel_gdc, "slot_ptr", "token_ptr")
declare_writes(slot_token_advance_kernel_gdc, "slot_ptr", "token_ptr", "ids_ptr", "pos_ptr")


def argmax_slot(device) -> torch.Tensor:
    """The key slot the head merges into and the token's kernel leaves at zero."""
    return torch.zeros(1, dtype=torch.int64, device=device)


def launch_head_argmax(x, weight, bias, norm_weight, eps: float, offset: float,
                       weight_scale, config: tuple | None = None, pdl: bool = False,
                       slot: torch.Tensor | None = None, token: torch.Tensor | None = None,
                       advance: tuple[torch.Tensor, torch.Tensor] | None = None,
                       x_qblock: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(reference.row_gemv(x, weight, bias, norm_weight, None, eps, offset, 0,
    weight_scale), its argmax: int64 [1], written into ``token`` where given); ``slot``:
    argmax_slot's zero, left at zero (by default a new one). ``config``: gemv_config's
    (BLOCK_N, BLOCK_K, num_warps, AHEAD), over int4 rows (``weight`` uint8: int4_rows.py's)
    int4_config's (BLOCK_N, BLOCK_G, num_warps, SPLIT_X); by default its choice.
    ``advance``: a greedy step's (input ids, positions), one int64 each: the token kernel
    also writes the token into the first and adds one to the second, after the head (the
    next step's inputs). ``x_qblock``: int8 rows against x's int8 codes in blocks of that
    many columns (reference.row_gemv's ``x_qblock``)."""
    rows = weight.shape[0]
    if rows > 2 ** 31 - 1:
        raise ValueError(f"a head of {rows} rows: the token's key holds 31 bits of index")
    for name, given in (("slot", slot), ("token", token),
                        *zip(("input ids", "positions"), advance or ())):
        if given is not None and (given.dtype != torch.int64 or given.numel() != 1):
            raise ValueError(f"{name}: one int64, got {given.numel()} {given.dtype}")
    slot = argmax_slot(x.device) if slot is None else slot
    token = torch.empty(1, dtype=torch.int64, device=x.device) if token is None else token
    out = torch.empty((*x.shape[:-1], rows), dtype=x.dtype, device=x.device)
    if weight.dtype == torch.uint8 and not x_qblock:
        _launch_int4_head(x, weight, bias, norm_weight, eps, offset, weight_scale, config,
                          pdl, out, slot)
    else:  # x's codes over anything but int8 rows: refused there
        _launch_head(x, weight, bias, norm_weight, eps, offset, weight_scale, config, pdl,
                     out, slot, x_qblock)
    if advance is None:
        launch, _ = launcher(slot_token_kernel, slot_token_kernel_gdc, x.device, pdl)
        launch((1,))(slot, token, num_warps=1)
    else:
        launch, _ = launcher(slot_token_advance_kernel, slot_token_advance_kernel_gdc,
                             x.device, pdl)
        launch((1,))(slot, token, *advance, num_warps=1)
    return out, token


def _launch_head(x, weight, bias, norm_weight, eps, offset, weight_scale, config, pdl,
                 out, slot, x_qblock: int) -> None:
    """The head's launch over float or int8 rows (row_gemv's kernel; int8_words_triton's
    rows against x's codes where ``x_qblock`` is set)."""
    rows, cols = weight.shape
    gdc = dependent_launch_here(x.device) and (pdl or library_launches_dependent())
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if gdc else 0
    block_n, block_k, warps, ahead = (config or gemv_config(
        rows, cols, False, gdc, weight.element_size(), sms, x_qblock=x_qblock))[:4]
    if x_qblock and not words_fit(weight, (block_n, block_k, warps, ahead), x_qblock):
        raise ValueError(f"x's codes in blocks of {x_qblock}: int8 rows of whole blocks, "
                         f"got {weight.dtype} {tuple(weight.shape)}")
    launch, gdc = launcher(head_argmax_kernel, head_argmax_kernel_gdc, x.device, pdl)
    dummy = weight  # an unused pointer argument (its branch is compiled out)
    weights_first = dict(W_AHEAD=weight.is_contiguous()) if gdc else {}
    launch((triton.cdiv(rows, block_n),))(
        x.reshape(cols), weight.contiguous(), dummy if bias is None else bias,
        dummy if norm_weight is None else norm_weight,
        dummy if weight_scale is None else weight_scale.reshape(-1), out, slot,
        EPS=eps, OFFSET=offset, N=rows, K=cols, HAS_BIAS=bias is not None,
        HAS_NORM=norm_weight is not None, HAS_SCALE=weight_scale is not None,
        BLOCK_N=block_n, BLOCK_K=block_k, AHEAD=ahead, QBLOCK=x_qblock,
        PTX=os.environ.get("TRITON_INTERPRET") != "1", num_warps=warps, **weights_first)


def _launch_int4_head(x, packed, bias, norm_weight, eps, offset, scales, config, pdl, out,
                      slot) -> None:
    """The head's launch over int4 rows (``packed`` [rows, K/2], ``scales`` [rows,
    K/group, 2]): int4_triton's kernel and its choice of shape."""
    rows, cols = packed.shape[0], x.shape[-1]
    group = cols // scales.shape[1]
    block_n, block_g, warps, split_x = config or int4_config(rows, cols, group, False)
    launch, _ = launcher(int4_head_argmax_kernel, int4_head_argmax_kernel_gdc, x.device, pdl)
    dummy = packed  # an unused pointer argument (its branch is compiled out)
    launch((triton.cdiv(rows, block_n),))(
        x.reshape(cols), packed.contiguous(), scales.contiguous(),
        dummy if bias is None else bias, dummy if norm_weight is None else norm_weight,
        out, slot, EPS=eps, OFFSET=offset, N=rows, K=cols, GROUP=group,
        HAS_BIAS=bias is not None, HAS_NORM=norm_weight is not None, BLOCK_N=block_n,
        BLOCK_G=block_g, SPLIT_X=bool(split_x), num_warps=warps)
