"""The decode attention at short caches as one kernel of few, long blocks
(decode_chain_cuda.py's ``... short attention ...`` variants): each program a key/value
head's grouped query heads over SPLITS-th of the slots, its past rows read before the
wait. After the wait every program loads q, the mask and the new row's key and value at
once (one round trip), so:
- SPLITS == 1 (a program a key/value head, all its slots): the program finishes the
  head's rows itself: no partial results, no count, no second round trip;
- SPLITS > 1: partial results, a count (``SEM``), and the last program joins them with
  the new row it has already loaded: only the partials are read after the count.
In the 22-layer fp16 chain (512 slots) its own time is 0.3-0.7 us a layer under the
library's joined kernel (4 blocks of 128 slots: 3.4 against 4.0 us), but the chain in
turns is not faster (within 1% either way); one block a key/value head (150+ registers,
half a multiprocessor a program) pushes the neighbouring products into a second wave and
loses 15%. A bench tool, not the library's.

    python bench/decode_attention_short.py      (no GPU: sm_90a registers of each form)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@triton.jit
def _short(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
           counts_ptr, out_ptr, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s, snv_h, sm,
           SCALE: tl.constexpr, S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
           SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr,
           BLOCK_D: tl.constexpr, BLOCK_J: tl.constexpr, IEEE: tl.constexpr,
           SEM: tl.constexpr, GDC: tl.constexpr):
    if GDC:
        tl.extra.cuda.gdc_launch_dependents()
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    s = split * BLOCK_S + tl.arange(0, BLOCK_S)
    g_ok, d_ok, s_ok = g < G, d < D, s < S
    heads = kvh * G + g
    kv_ok = s_ok[:, None] & d_ok[None, :]
    # the cache's own rows: read before the wait (a script's cache, as CACHE_AHEAD)
    k = tl.load(pk_ptr + kvh * spk_h + s[:, None] * spk_s + d[None, :], mask=kv_ok, other=0.0)
    v = tl.load(pv_ptr + kvh * spv_h + s[:, None] * spv_s + d[None, :], mask=kv_ok, other=0.0)
    if GDC:
        tl.extra.cuda.gdc_wait()
    # everything the step wrote, in one round trip
    q = tl.load(q_ptr + heads[:, None] * sq_h + d[None, :], mask=g_ok[:, None] & d_ok[None, :],
                other=0.0)
    added = tl.load(mask_ptr + s * sm, mask=s_ok, other=float("-inf")).to(tl.float32)
    key = tl.load(nk_ptr + kvh * snk_h + d, mask=d_ok, other=0.0).to(tl.float32)
    value = tl.load(nv_ptr + kvh * snv_h + d, mask=d_ok, other=0.0).to(tl.float32)
    new = (tl.sum(q.to(tl.float32) * key[None, :], axis=1) * SCALE
           + tl.load(mask_ptr + S * sm).to(tl.float32))
    if IEEE:
        scores = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        scores = tl.dot(q, tl.trans(k))
    scores = scores * SCALE + added[None, :]
    if SPLITS == 1:
        top = tl.maximum(tl.max(scores, axis=1), new)
    else:
        top = tl.maximum(tl.max(scores, axis=1), -1e30)  # a masked block only: no NaN
    p = tl.exp(scores - top[:, None])
    total = tl.sum(p, axis=1)
    if IEEE:
        acc = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v)
    out_at = out_ptr + heads[:, None] * D + d[None, :]
    out_ok = g_ok[:, None] & d_ok[None, :]
    if SPLITS == 1:
        weight_new = tl.exp(new - top)
        out = (acc + weight_new[:, None] * value[None, :]) / (total + weight_new)[:, None]
        tl.store(out_at, out.to(out_ptr.dtype.element_ty), mask=out_ok)
    else:
        part = heads * SPLITS + split
        tl.store(m_ptr + part, top, mask=g_ok)
        tl.store(l_ptr + part, total, mask=g_ok)
        tl.store(acc_ptr + part[:, None] * BLOCK_D + d[None, :], acc, mask=g_ok[:, None])
        tl.debug_barrier()  # every thread's stores before the count
        seen = tl.atomic_add(counts_ptr + kvh, 1, sem=SEM, scope="gpu")
        if seen == SPLITS - 1:
            j = tl.arange(0, BLOCK_J)
            parts = heads[:, None] * SPLITS + j[None, :]
            ok = g_ok[:, None] & (j < SPLITS)[None, :]
            tops = tl.load(m_ptr + parts, mask=ok, other=-1e30, cache_modifier=".cg")
            sums = tl.load(l_ptr + parts, mask=ok, other=0.0, cache_modifier=".cg")
            accs = tl.load(acc_ptr + parts[:, :, None] * BLOCK_D + d[None, None, :],
                           mask=ok[:, :, None], other=0.0, cache_modifier=".cg")
            joined_top = tl.maximum(tl.max(tops, axis=1), new)
            weights = tl.exp(tops - joined_top[:, None])
            new_weight = tl.exp(new - joined_top)
            joined_total = tl.sum(sums * weights, axis=1) + new_weight
            joined = (tl.sum(accs * weights[:, :, None], axis=1)
                      + new_weight[:, None] * value[None, :]) / joined_total[:, None]
            tl.store(out_at, joined.to(out_ptr.dtype.element_ty), mask=out_ok)
            tl.store(counts_ptr + kvh, 0)  # every program counted in: back to zero


@triton.jit
def short_attention_kernel(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr,
                           acc_ptr, counts_ptr, out_ptr, sq_h, spk_h, spk_s, snk_h, spv_h,
                           spv_s, snv_h, sm, SCALE: tl.constexpr, S: tl.constexpr,
                           D: tl.constexpr, G: tl.constexpr, SPLITS: tl.constexpr,
                           BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr,
                           BLOCK_D: tl.constexpr, BLOCK_J: tl.constexpr, IEEE: tl.constexpr,
                           SEM: tl.constexpr):
    _short(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, counts_ptr,
           out_ptr, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s, snv_h, sm, SCALE, S, D, G,
           SPLITS, BLOCK_S, BLOCK_G, BLOCK_D, BLOCK_J, IEEE, SEM, False)


@triton.jit
def short_attention_kernel_gdc(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr,
                               acc_ptr, counts_ptr, out_ptr, sq_h, spk_h, spk_s, snk_h,
                               spv_h, spv_s, snv_h, sm, SCALE: tl.constexpr,
                               S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                               SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                               BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                               BLOCK_J: tl.constexpr, IEEE: tl.constexpr, SEM: tl.constexpr):
    _short(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, counts_ptr,
           out_ptr, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s, snv_h, sm, SCALE, S, D, G,
           SPLITS, BLOCK_S, BLOCK_G, BLOCK_D, BLOCK_J, IEEE, SEM, True)


def short_sizes(query, past_k, splits: int, sem: str = "acq_rel") -> dict:
    """The kernel's constexprs for a query [1, H, 1, D] over a past [1, KVH, S, D] in
    ``splits`` blocks of slots a key/value head."""
    heads, dim = query.shape[1], query.shape[-1]
    kv_heads, slots = past_k.shape[1], past_k.shape[2]
    groups = heads // kv_heads
    return dict(SCALE=float(dim ** -0.5), S=slots, D=dim, G=groups, SPLITS=splits,
                # tl.dot's least width: blocks past the cache are masked whole
                BLOCK_S=max(16, triton.next_power_of_2(triton.cdiv(slots, splits))),
                BLOCK_G=max(16, triton.next_power_of_2(groups)),
                BLOCK_D=max(16, triton.next_power_of_2(dim)),
                BLOCK_J=max(2, triton.next_power_of_2(splits)),
                IEEE=query.dtype == torch.float32, SEM=sem)


def launch_short_attention(query, past_k, new_k, past_v, new_v, mask, counts,
                           splits: int = 1, warps: int = 8, pdl: bool = False,
                           sem: str = "acq_rel", scale: float | None = None) -> torch.Tensor:
    """The attention of decode_attention.launch_decode_attention (``counts``: int32 zeros,
    one or more a key/value head, left at zero; unused where ``splits`` is 1), its past
    rows read before the wait in the dependent form (``pdl``)."""
    heads, dim = query.shape[1], query.shape[-1]
    kv_heads = past_k.shape[1]
    sizes = short_sizes(query, past_k, splits, sem)
    if scale is not None:
        sizes["SCALE"] = float(scale)
    query, past_k, past_v, new_k, new_v = (t if t.stride(-1) == 1 else t.contiguous()
                                           for t in (query, past_k, past_v, new_k, new_v))
    parts = heads * splits if splits > 1 else 1
    tops = torch.empty((parts,), dtype=torch.float32, device=query.device)
    sums = torch.empty_like(tops)
    accs = torch.empty((parts, sizes["BLOCK_D"]), dtype=torch.float32, device=query.device)
    out = torch.empty((1, heads, 1, dim), dtype=query.dtype, device=query.device)
    kernel = short_attention_kernel_gdc if pdl else short_attention_kernel
    extra = dict(launch_pdl=True) if pdl else {}
    kernel[(kv_heads, splits)](
        query, past_k, new_k, past_v, new_v, mask, tops, sums, accs, counts, out,
        query.stride(1), past_k.stride(1), past_k.stride(2), new_k.stride(1),
        past_v.stride(1), past_v.stride(2), new_v.stride(1), mask.stride(-1),
        num_warps=warps, **sizes, **extra)
    return out


class ShortAttention:
    """decode_chain_cuda.step's attention (its ``configs["attention"]``): this kernel for
    every layer with ``splits`` blocks a key/value head and ``warps``; plain launches as
    the library's (the bench's reference), or this kernel's plain form (``own_plain``:
    under Triton's interpreter, which has no dependent launches)."""

    def __init__(self, splits: int, warps: int, sem: str = "acq_rel", own_plain=False):
        self.splits, self.warps, self.sem, self.own_plain = splits, warps, sem, own_plain

    def __repr__(self) -> str:  # the row's "configs" in the bench's JSON
        return f"short(splits {self.splits}, {self.warps} warps, {self.sem})"

    def attention(self, q, k, v, layer: dict, made: dict, pdl: bool) -> torch.Tensor:
        if not pdl and not self.own_plain:
            from targets.aoti.kernels.decode_attention import launch_decode_attention
            return launch_decode_attention(q, layer["k"], k, layer["v"], v, made["mask"],
                                           q.shape[-1] ** -0.5, counts=made["counts"])
        return launch_short_attention(q, layer["k"], k, layer["v"], v, made["mask"],
                                      made["counts"], self.splits, self.warps, pdl, self.sem)


# name -> (blocks a key/value head, warps, the count's semantics); 512 slots: 512, 256,
# 128 or 64 slots a program
CHANGES = {
    "short attention 1 block 8 warps": (1, 8, "acq_rel"),
    "short attention 1 block 16 warps": (1, 16, "acq_rel"),
    "short attention 2 blocks 4 warps": (2, 4, "acq_rel"),
    "short attention 2 blocks 8 warps": (2, 8, "acq_rel"),
    "short attention 4 blocks 4 warps": (4, 4, "acq_rel"),
    "short attention 4 blocks 8 warps": (4, 8, "acq_rel"),
    "short attention 8 blocks 4 warps": (8, 4, "acq_rel"),
    "short attention 16 blocks 4 warps": (16, 4, "acq_rel"),
    # the count a release only: the joiner reads the partials without an acquire (a
    # measure of the fence, not a form for the library)
    "short attention 4 blocks 4 warps release": (4, 4, "release"),
}


def short_variants(default: dict) -> dict:
    """decode_chain_cuda.variants()'s entries: "dependent + join" with this attention."""
    return {f"dependent + join + {name}": (True, {**default, "attention": ShortAttention(
        *changes)}, None, True) for name, changes in CHANGES.items()}


def compiled(splits: int, warps: int, sem: str = "acq_rel", slots: int = 512) -> tuple:
    """The ``_gdc`` form for the ~1.1B's attention (32 heads over 4, 64 wide) compiled
    for sm_90a here: (registers, spilled bytes) by ptxas."""
    from bench.int4_rows_ptx import ATTENTION_STRIDES, ptxas_report, sm90_compiled
    query = torch.empty(1, 32, 1, 64, dtype=torch.float16, device="meta")
    past = torch.empty(1, 4, slots, 64, dtype=torch.float16, device="meta")
    # as a launch specializes them: strides of 16 elements or more, the mask's 1
    kinds = {"m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32", "counts_ptr": "*i32"}
    values = {"sm": 1, **short_sizes(query, past, splits, sem)}
    made = sm90_compiled(short_attention_kernel_gdc, kinds, values, warps, ATTENTION_STRIDES)
    return ptxas_report(made.asm["ptx"])


def main() -> None:
    for name, (splits, warps, sem) in CHANGES.items():
        regs, spills = compiled(splits, warps, sem)
        print(f"{name:44s} registers {regs:3d}, spilled {spills:5d} B, grid {4 * splits}",
              flush=True)


if __name__ == "__main__":
    main()
