"""A decode layer's attention and o (+ residual) as one launch (the
``edge_exporter::decode_attention_o`` op): a 1-D grid whose first KVH x SPLITS programs
are decode_attention.py's joined attention (blocks of slots, the last of a key/value
head joins its query heads, then counts in on a flag) and whose other programs are o's
rows: each loads its rows of Wo whole before the launch's wait, waits for the kernel
before (the residual), spins until every key/value head has joined, and reads the
attention's output. o's weights stream while the attention computes, and a layer has one
kernel boundary fewer. Over int4 rows (int4_rows.py's format) an o program loads its
first two tiles before the wait and the rest in int4_triton.py's loop (its pieces, not
a copy), after the spin.

Why the spin ends: an attention program waits on nothing a program of this launch does,
so it ends once it has started; an o program spins only while some attention program
has not. A GPU dispatches a 1-D grid's programs in the order of their index (NVIDIA
hardware does; CUDA does not promise it), so the attention's are resident or done before
the first o program starts; and at the ~1.1B's shape the whole grid (16 + 512 programs
of 4 warps, 88 registers) is resident at once on an H200 (132 SMs, 5 such programs
each) whatever the order: the kernel after it starts only once every program of this
one has (each triggers it at its start), and the kernel before ends before any spin.
Past 2^20 polls (over 60 ms) a spin gives up with a ``trap``: the launch fails, so the
step raises a CUDA error where it would otherwise compute from an attention not yet
written; it never returns wrong numbers.
Under Triton's interpreter (programs one after another, in order) the attention has
finished before the first o program polls.

The flag is one of three slots of ``flags`` (each its own 128-byte line): a launch counts
on slot ``slot`` and its program 0, after its wait (every launch before it has ended),
zeroes slot ``reset``, the next launch's (attention_o_slots.flag_slots: no two launches
in a row share one). Like the join's counts, the flags are the launches' own: no other
kernel reads them, and the op does not declare them written (a library would copy them
each call).

The store form (``attention_o_store_kernel``, op ``decode_attention_o_store``) also
writes the step's new key and value rows into the past buffers, as decode_attention.py's
store form does and with its code: the joining program of a key/value head, after every
program of that head has counted in, at slot ``position % slots`` (masked this step). A
form of its own for the same reason: only it declares the past buffers written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from targets.aoti.kernels.attention_o_slots import SLOTS, STRIDE, attention_splits, joins_o
from targets.aoti.kernels.decode_attention import _attention_block, _join_heads, _store_row
from targets.aoti.kernels.dependent_launch import declare_writes, launcher
from targets.aoti.kernels.int4_triton import _first_tiles, _group_sums, groups_a_step

_STRIDE = tl.constexpr(STRIDE)
LIMIT = tl.constexpr(1 << 20)  # polls before a spin gives up (64 ns apart: over 60 ms)
ROWS = 4  # o's rows a program, 4 warps (the 22-layer chain's best, with SPLITS below)


@triton.jit
def _poll(flag_ptr, TARGET: tl.constexpr, POLL: tl.constexpr):
    """Until the flag holds TARGET counts: one thread polls with acquire loads at gpu
    scope, 64 ns apart, and traps past LIMIT polls (POLL 0, the interpreter: Triton
    atomics, no limit); then the CTA barrier orders every thread after it."""
    if POLL == 0:
        seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="gpu")
        while seen < TARGET:
            seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="gpu")
    else:
        tl.inline_asm_elementwise(
            f"""{{
            .reg .pred ao_skip, ao_done, ao_late;
            .reg .u32 ao_tid, ao_n;
            mov.u32 $0, 0;
            mov.u32 ao_tid, %tid.x;
            setp.ne.u32 ao_skip, ao_tid, 0;
            @ao_skip bra AO_END;
            mov.u32 ao_n, 0;
            AO_POLL:
            ld.acquire.gpu.global.u32 $0, [$1];
            setp.ge.u32 ao_done, $0, {TARGET};
            @ao_done bra AO_END;
            add.u32 ao_n, ao_n, 1;
            setp.ge.u32 ao_late, ao_n, {LIMIT};
            @ao_late trap;
            nanosleep.u32 64;
            bra AO_POLL;
            AO_END:
            }}""",
            "=r,l", [flag_ptr], dtype=tl.int32, is_pure=False, pack=1)
    tl.debug_barrier()


@triton.jit
def _o_rows(att_ptr, w_ptr, s_ptr, r_ptr, out_ptr, flag_ptr, block, N: tl.constexpr,
            K: tl.constexpr, KVH: tl.constexpr, BLOCK_N: tl.constexpr,
            HAS_SCALE: tl.constexpr, GROUP: tl.constexpr, BLOCK_G4: tl.constexpr,
            POLL: tl.constexpr, GDC: tl.constexpr):
    """o's rows of ``block`` (float rows; int8 with a scale a row: HAS_SCALE; int4: GROUP):
    Wo's rows before the wait, the residual after it, the spin until every key/value head
    has joined (the flag counts KVH), then the attention's output."""
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    cols = tl.arange(0, K)
    if GROUP:  # int4 rows: their first two tiles of bytes and of (scale, offset) pairs
        ahead, ahead2, pairs, pairs2 = _first_tiles(w_ptr, s_ptr, rows, row_ok, K,
                                                    GROUP, BLOCK_G4)
    else:
        w = tl.load(w_ptr + rows[:, None] * K + cols[None, :], mask=row_ok[:, None],
                    other=0.0, eviction_policy="evict_first")
    if GDC:
        tl.extra.cuda.gdc_wait()
    residual = tl.load(r_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    if HAS_SCALE:  # int8 rows: a scale a row
        scale = tl.load(s_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    _poll(flag_ptr, KVH, POLL)
    if GROUP:  # the rest of the rows stream as the loop reads the attention's output
        # (plain loads: the poll's acquire at gpu scope, then the CTA barrier, order
        # them after the joins' release, past this SM's L1)
        acc, _ = _group_sums(att_ptr, w_ptr, s_ptr, att_ptr, rows, row_ok, ahead,
                             ahead2, pairs, pairs2, 0.0, K, GROUP, BLOCK_N, BLOCK_G4,
                             False, False)
        y = tl.sum(acc, axis=1)
    else:
        # .cg: other programs of this launch wrote it; read past this SM's L1
        x = tl.load(att_ptr + cols, cache_modifier=".cg").to(tl.float32)
        y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    if HAS_SCALE:
        y *= scale
    y += residual
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def _attention_o(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                 counts_ptr, att_ptr, flags_ptr, w_ptr, s_ptr, r_ptr, out_ptr, pos_ptr,
                 slot, reset,
                 sq_h, spk_h, spk_s, snk_h, spv_h, spv_s, snv_h, sm, SCALE: tl.constexpr,
                 S: tl.constexpr, D: tl.constexpr, G: tl.constexpr, KVH: tl.constexpr,
                 SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr,
                 BLOCK_D: tl.constexpr, IEEE: tl.constexpr, JOIN_G: tl.constexpr,
                 BLOCK_J: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                 BLOCK_N: tl.constexpr, HAS_SCALE: tl.constexpr, GROUP: tl.constexpr,
                 BLOCK_G4: tl.constexpr, POLL: tl.constexpr, GDC: tl.constexpr,
                 CACHE_AHEAD: tl.constexpr, STORE: tl.constexpr):
    """STORE: the joining program of a key/value head also writes the new row into the
    past buffers at slot ``pos_ptr[0] % S`` (pos_ptr is not read otherwise). GROUP > 0:
    o's rows are int4 rows (int4_rows.py's, ``s_ptr`` their (scale, offset) pairs), read
    BLOCK_G4 groups a step by int4_triton.py's loop."""
    pid = tl.program_id(0)
    if GDC:
        tl.extra.cuda.gdc_launch_dependents()
    flag_ptr = flags_ptr + slot * _STRIDE
    if pid < KVH * SPLITS:  # the attention: a block of slots of a key/value head
        kvh = pid // SPLITS
        _attention_block(q_ptr, pk_ptr, pv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, kvh,
                         pid % SPLITS, sq_h, spk_h, spk_s, spv_h, spv_s, sm, SCALE, S, D,
                         G, SPLITS, BLOCK_S, BLOCK_G, BLOCK_D, IEEE, GDC, CACHE_AHEAD)
        if pid == 0:  # past its wait: every launch before this one has ended
            tl.store(flags_ptr + reset * _STRIDE, 0)
        tl.debug_barrier()  # every thread's stores before the count
        seen = tl.atomic_add(counts_ptr + kvh, 1, sem="acq_rel", scope="gpu")
        if seen == SPLITS - 1:
            _join_heads(q_ptr, nk_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, att_ptr,
                        kvh, sq_h, snk_h, snv_h, sm, SCALE, S, D, G, SPLITS, JOIN_G,
                        BLOCK_J, BLOCK_D)
            tl.store(counts_ptr + kvh, 0)
            tl.debug_barrier()  # the head's output stored before the flag counts it
            tl.atomic_add(flag_ptr, 1, sem="release", scope="gpu")
            if STORE:  # every program of this head read its past rows before counting
                # in; after the flag, as o's programs read no cache
                _store_row(pk_ptr, nk_ptr, pv_ptr, nv_ptr, pos_ptr, kvh, spk_h, spk_s,
                           snk_h, spv_h, spv_s, snv_h, S, D, BLOCK_D)
    else:  # o's rows: Wo's whole rows before the wait, the attention's output after
        _o_rows(att_ptr, w_ptr, s_ptr, r_ptr, out_ptr, flag_ptr, pid - KVH * SPLITS, N, K,
                KVH, BLOCK_N, HAS_SCALE, GROUP, BLOCK_G4, POLL, GDC)


@triton.jit
def attention_o_kernel(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr,
                       acc_ptr, counts_ptr, att_ptr, flags_ptr, w_ptr, s_ptr, r_ptr, out_ptr,
                       slot, reset, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s, snv_h, sm,
                       SCALE: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
                       G: tl.constexpr, KVH: tl.constexpr, SPLITS: tl.constexpr,
                       BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                       IEEE: tl.constexpr, JOIN_G: tl.constexpr, BLOCK_J: tl.constexpr,
                       N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                       HAS_SCALE: tl.constexpr, GROUP: tl.constexpr,
                       BLOCK_G4: tl.constexpr, POLL: tl.constexpr):
    _attention_o(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                 counts_ptr, att_ptr, flags_ptr, w_ptr, s_ptr, r_ptr, out_ptr, counts_ptr,
                 slot, reset, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s, snv_h, sm, SCALE, S,
                 D, G, KVH, SPLITS, BLOCK_S, BLOCK_G, BLOCK_D, IEEE, JOIN_G, BLOCK_J, N, K,
                 BLOCK_N, HAS_SCALE, GROUP, BLOCK_G4, POLL, False, False, False)


@triton.jit
def attention_o_kernel_gdc(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr,
                           acc_ptr, counts_ptr, att_ptr, flags_ptr, w_ptr, s_ptr, r_ptr,
                           out_ptr, slot, reset, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s,
                           snv_h, sm, SCALE: tl.constexpr, S: tl.constexpr,
                           D: tl.constexpr, G: tl.constexpr, KVH: tl.constexpr,
                           SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                           BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                           IEEE: tl.constexpr, JOIN_G: tl.constexpr, BLOCK_J: tl.constexpr,
                           N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                           HAS_SCALE: tl.constexpr, GROUP: tl.constexpr,
                           BLOCK_G4: tl.constexpr, POLL: tl.constexpr,
                           CACHE_AHEAD: tl.constexpr):
    _attention_o(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                 counts_ptr, att_ptr, flags_ptr, w_ptr, s_ptr, r_ptr, out_ptr, counts_ptr,
                 slot, reset, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s, snv_h, sm, SCALE, S,
                 D, G, KVH, SPLITS, BLOCK_S, BLOCK_G, BLOCK_D, IEEE, JOIN_G, BLOCK_J, N, K,
                 BLOCK_N, HAS_SCALE, GROUP, BLOCK_G4, POLL, True, CACHE_AHEAD, False)


@triton.jit
def attention_o_store_kernel(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr,
                             acc_ptr, counts_ptr, att_ptr, flags_ptr, w_ptr, s_ptr, r_ptr,
                             out_ptr, pos_ptr, slot, reset, sq_h, spk_h, spk_s, snk_h,
                             spv_h, spv_s, snv_h, sm, SCALE: tl.constexpr,
                             S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                             KVH: tl.constexpr, SPLITS: tl.constexpr,
                             BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr,
                             BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
                             JOIN_G: tl.constexpr, BLOCK_J: tl.constexpr, N: tl.constexpr,
                             K: tl.constexpr, BLOCK_N: tl.constexpr,
                             HAS_SCALE: tl.constexpr, GROUP: tl.constexpr,
                             BLOCK_G4: tl.constexpr, POLL: tl.constexpr):
    _attention_o(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                 counts_ptr, att_ptr, flags_ptr, w_ptr, s_ptr, r_ptr, out_ptr, pos_ptr,
                 slot, reset, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s, snv_h, sm, SCALE, S,
                 D, G, KVH, SPLITS, BLOCK_S, BLOCK_G, BLOCK_D, IEEE, JOIN_G, BLOCK_J, N, K,
                 BLOCK_N, HAS_SCALE, GROUP, BLOCK_G4, POLL, False, False, True)


@triton.jit
def attention_o_store_kernel_gdc(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr,
                                 l_ptr, acc_ptr, counts_ptr, att_ptr, flags_ptr, w_ptr,
                                 s_ptr, r_ptr, out_ptr, pos_ptr, slot, reset, sq_h, spk_h,
                                 spk_s, snk_h, spv_h, spv_s, snv_h, sm, SCALE: tl.constexpr,
                                 S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                                 KVH: tl.constexpr, SPLITS: tl.constexpr,
                                 BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr,
                                 BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
                                 JOIN_G: tl.constexpr, BLOCK_J: tl.constexpr,
                                 N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                                 HAS_SCALE: tl.constexpr, GROUP: tl.constexpr,
                                 BLOCK_G4: tl.constexpr, POLL: tl.constexpr,
                                 CACHE_AHEAD: tl.constexpr):
    _attention_o(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                 counts_ptr, att_ptr, flags_ptr, w_ptr, s_ptr, r_ptr, out_ptr, pos_ptr,
                 slot, reset, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s, snv_h, sm, SCALE, S,
                 D, G, KVH, SPLITS, BLOCK_S, BLOCK_G, BLOCK_D, IEEE, JOIN_G, BLOCK_J, N, K,
                 BLOCK_N, HAS_SCALE, GROUP, BLOCK_G4, POLL, True, CACHE_AHEAD, True)


# not counts_ptr or flags_ptr: the launches leave the counts at zero and own the flags,
# so a library need not copy them for each call (torch's analysis takes atomics as writes)
declare_writes(attention_o_kernel_gdc, "m_ptr", "l_ptr", "acc_ptr", "att_ptr", "out_ptr")
# the past buffers too: the op mutates them in place (ops.decode_attention_o_store)
declare_writes(attention_o_store_kernel_gdc, "pk_ptr", "pv_ptr", "m_ptr", "l_ptr", "acc_ptr",
               "att_ptr", "out_ptr")


def launch_decode_attention_o(query, past_k, new_k, past_v, new_v, mask, scale: float,
                              cache_ahead: bool, counts: torch.Tensor, weight: torch.Tensor,
                              weight_scale: torch.Tensor | None, residual: torch.Tensor,
                              flags: torch.Tensor, slot: int, reset: int,
                              positions: torch.Tensor | None = None,
                              pdl: bool = False,
                              config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """reference.decode_attention_o in one launch: ``counts`` int32 zeros, one a
    key/value head (left at zero); ``flags`` int32, SLOTS x STRIDE, zeros before the
    step's first launch (``slot`` counted on, ``reset`` zeroed: flag_slots).
    ``positions``: the step's (int64, the first this token's): the new row is also
    written into ``past_k``/``past_v`` at slot ``position % slots``. ``weight_scale``:
    int8 rows' scale a row, or int4 rows' (scale, offset) pairs [rows, groups, 2]
    (``weight`` uint8 [rows, cols / 2]: int4_rows.py's format). ``config``: (blocks of
    slots a key/value head, o's rows a program, warps), the timing scripts' other shapes;
    None: attention_splits' blocks, ROWS rows and 4 warps, what a build runs."""
    heads, dim = query.shape[1], query.shape[-1]
    kv_heads, slots = past_k.shape[1], past_k.shape[2]
    rows, cols = weight.shape[0], heads * dim
    int4 = weight.dtype == torch.uint8  # int4 rows: two weights a byte
    if not joins_o(heads, dim, slots) or weight.shape[1] != (cols // 2 if int4 else cols):
        raise ValueError(f"o's row of {heads} x {dim} over {slots} slots is not joined")
    group = cols // weight_scale.shape[1] if int4 else 0
    if int4 and (weight_scale.shape[0] != rows or group * weight_scale.shape[1] != cols):
        raise ValueError(f"int4 rows' (scale, offset) pairs: {tuple(weight_scale.shape)} "
                         f"for {rows} rows of {cols}")
    if flags.numel() < SLOTS * STRIDE or not (0 <= slot < SLOTS and 0 <= reset < SLOTS):
        raise ValueError(f"flags: {SLOTS} slots of {STRIDE} int32s, slot/reset below {SLOTS}")
    if positions is not None and (past_k.stride(-1) != 1 or past_v.stride(-1) != 1):
        # a copy of the cache would take the row, not the cache
        raise ValueError("storing the new row needs past rows of unit stride")
    splits, block_n, warps = config or (attention_splits(weight.dtype == torch.int8),
                                        ROWS, 4)
    if min(splits, block_n, warps) < 1 or block_n & (block_n - 1) or warps & (warps - 1):
        raise ValueError(f"config {config}: (blocks of slots, rows a power of two, warps "
                         "a power of two)")
    groups = heads // kv_heads
    block_d = max(16, triton.next_power_of_2(dim))
    join_g = triton.next_power_of_2(groups)
    store = positions is not None
    kernel, gdc = launcher(attention_o_store_kernel if store else attention_o_kernel,
                           attention_o_store_kernel_gdc if store else attention_o_kernel_gdc,
                           query.device, pdl)
    ahead = dict(CACHE_AHEAD=bool(cache_ahead) and past_k.stride(-1) == 1
                 and past_v.stride(-1) == 1) if gdc else {}
    query, past_k, past_v, new_k, new_v = (t if t.stride(-1) == 1 else t.contiguous()
                                           for t in (query, past_k, past_v, new_k, new_v))
    tops = torch.empty((heads * splits,), dtype=torch.float32, device=query.device)
    sums = torch.empty_like(tops)
    accs = torch.empty((heads * splits, block_d), dtype=torch.float32, device=query.device)
    att = torch.empty((cols,), dtype=query.dtype, device=query.device)
    out = torch.empty((*residual.shape[:-1], rows), dtype=residual.dtype,
                      device=residual.device)
    grid = kv_heads * splits + triton.cdiv(rows, block_n)
    kernel((grid,))(
        query, past_k, new_k, past_v, new_v, mask, tops, sums, accs, counts, att, flags,
        weight, weight if weight_scale is None else weight_scale.reshape(-1),
        residual.contiguous(), out, *((positions,) if store else ()), slot,
        reset, query.stride(1), past_k.stride(1), past_k.stride(2), new_k.stride(1),
        past_v.stride(1), past_v.stride(2), new_v.stride(1), mask.stride(-1),
        SCALE=float(scale), S=slots, D=dim, G=groups, KVH=kv_heads, SPLITS=splits,
        BLOCK_S=max(16, triton.next_power_of_2(triton.cdiv(slots, splits))),
        BLOCK_G=max(16, triton.next_power_of_2(groups)), BLOCK_D=block_d,
        IEEE=query.dtype == torch.float32, JOIN_G=join_g,
        BLOCK_J=min(max(2, triton.next_power_of_2(splits)),
                    max(2, 8192 // (join_g * block_d))),
        N=rows, K=cols, BLOCK_N=block_n, HAS_SCALE=weight_scale is not None and not int4,
        GROUP=group, BLOCK_G4=groups_a_step(block_n, warps, cols, group) if int4 else 1,
        POLL=int(query.device.type == "cuda"), num_warps=warps, **ahead)
    return out
