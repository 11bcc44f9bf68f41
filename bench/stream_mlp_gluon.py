"""The kernel of bench/persistent_mlp_stream.py, in Gluon (Triton 3.6's
``triton.experimental.gluon``): a layer's o -> gate/up -> down as one persistent kernel
whose weight stream does not stop at the grid-wide barriers between the products.

Each program owns a fixed list of weight tiles (ROWS rows x CHUNKS x WIDTH columns): its
o row blocks, then its gate/up row blocks, then its down row blocks, a row block being
PARTS tiles along the columns (the copy engine fills zeros past a matrix's edge). A ring
of SLOTS tiles in shared memory, one mbarrier a slot, is filled by TMA copies in the
program's own order across the products: taking tile t from its slot re-issues the slot
with tile t + SLOTS. So the first tiles of gate/up (and of down) are already on their way
while the program counts in at a barrier and spins, and the first SLOTS tiles (o's, then
gate/up's) stream while the attention before is still running (issued before gdc_wait:
no kernel of a step writes weights).

The tile order here and ``plan``/``tiles`` in persistent_mlp_stream.py are one mapping,
written twice (Gluon cannot call Python): local tile l of a product is row block
``pid + (l // PARTS) * PROGRAMS``, column part ``l % PARTS``.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                              tma)

_ACQUIRE: gl.constexpr = gl.constexpr("ld.acquire.gpu.global.b32 $0, [$1];")


@gluon.jit
def _copy(desc, local, bar, dst, PARTS: gl.constexpr, PROGRAMS: gl.constexpr,
          ROWS: gl.constexpr, CHUNKS: gl.constexpr):
    """Local tile ``local`` of a product into ``dst`` (a 3-D box: rows, chunks, width)."""
    row = (gl.program_id(0) + (local // PARTS) * PROGRAMS) * ROWS
    tma.async_copy_global_to_shared(desc, [row, (local % PARTS) * CHUNKS, 0], bar, dst)


@gluon.jit
def _issue(u, wo_desc, wgu_desc, wd_desc, ring, bars, PROGRAMS: gl.constexpr,
           ROWS: gl.constexpr, CHUNKS: gl.constexpr, SLOTS: gl.constexpr,
           TURNS_O: gl.constexpr, PARTS_O: gl.constexpr, TURNS_G: gl.constexpr,
           PARTS_G: gl.constexpr, TURNS_D: gl.constexpr, PARTS_D: gl.constexpr):
    """The program's tile ``u`` (of all three products, in order) into slot u % SLOTS;
    nothing past its last tile."""
    END_O: gl.constexpr = TURNS_O * PARTS_O
    END_G: gl.constexpr = END_O + TURNS_G * PARTS_G
    END: gl.constexpr = END_G + TURNS_D * PARTS_D
    if u < END:
        bar = bars.index(u % SLOTS)
        dst = ring.index(u % SLOTS)
        # every box is the same size; the copy engine counts zero-filled bytes too
        mbarrier.expect(bar, wo_desc.block_type.nbytes)
        if u < END_O:
            _copy(wo_desc, u, bar, dst, PARTS_O, PROGRAMS, ROWS, CHUNKS)
        elif u < END_G:
            _copy(wgu_desc, u - END_O, bar, dst, PARTS_G, PROGRAMS, ROWS, CHUNKS)
        else:
            _copy(wd_desc, u - END_G, bar, dst, PARTS_D, PROGRAMS, ROWS, CHUNKS)


@gluon.jit
def _stamp(stamps_ptr, at: gl.constexpr, STAMPS: gl.constexpr):
    """With STAMPS, the GPU's clock (ns) now, as this program's ``at``-th of 8 stamps."""
    if STAMPS:
        now = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r",
                                        [gl.program_id(0)], dtype=gl.int64, is_pure=False,
                                        pack=1)
        gl.store(stamps_ptr + gl.program_id(0) * 8 + at, now)


@gluon.jit
def _grid_barrier(sync_ptr, PROGRAMS: gl.constexpr, SPINS: gl.constexpr):
    """Counts this program in (releasing what it wrote) and spins, each thread on its own
    acquiring reads, until the count reaches the next multiple of PROGRAMS (the count
    only grows and wraps in 32 bits: PROGRAMS is a power of two). After SPINS reads it
    gives up and marks ``sync_ptr[1]``: a wrong result the check sees, not a hang."""
    gl.thread_barrier()  # every thread's stores before the count: the release covers them
    seen = gl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")
    seen = seen.to(gl.uint32, bitcast=True)
    opens = (seen // PROGRAMS + 1) * PROGRAMS
    now = gl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu").to(gl.uint32, bitcast=True)
    spins = 0
    while ((now - opens).to(gl.int32, bitcast=True) < 0) & (spins < SPINS):
        now = gl.inline_asm_elementwise(_ACQUIRE, "=r,l", [sync_ptr.to(gl.int64)],
                                        dtype=gl.uint32, is_pure=False, pack=1)
        spins += 1
    if spins >= SPINS:
        gl.atomic_or(sync_ptr + 1, 1)
    gl.thread_barrier()


@gluon.jit
def _columns(p: gl.constexpr, XL: gl.constexpr, CHUNKS: gl.constexpr, WIDTH: gl.constexpr):
    """The column numbers of part ``p`` as [CHUNKS, WIDTH] in layout XL."""
    chunk = gl.arange(0, CHUNKS, layout=gl.SliceLayout(1, XL))
    lane = gl.arange(0, WIDTH, layout=gl.SliceLayout(0, XL))
    return p * CHUNKS * WIDTH + gl.expand_dims(chunk, 1) * WIDTH + gl.expand_dims(lane, 0)


@gluon.jit
def _stage_plain(x_ptr, xs, K: gl.constexpr, PARTS: gl.constexpr, XL: gl.constexpr,
                 CHUNKS: gl.constexpr, WIDTH: gl.constexpr):
    """o's x (the attention's row) into shared memory, fp32, zeros past K."""
    for p in gl.static_range(PARTS):
        cols = _columns(p, XL, CHUNKS, WIDTH)
        xs.index(p).store(gl.load(x_ptr + cols, mask=cols < K, other=0.0).to(gl.float32))


@gluon.jit
def _stage_normed(x_ptr, nw_ptr, xs, EPS: gl.constexpr, K: gl.constexpr,
                  PARTS: gl.constexpr, XL: gl.constexpr, CHUNKS: gl.constexpr,
                  WIDTH: gl.constexpr):
    """gate/up's x: RMSNorm(o) (every program's o rows, read past L1) into shared memory."""
    squares = 0.0
    for p in gl.static_range(PARTS):
        cols = _columns(p, XL, CHUNKS, WIDTH)
        v = gl.load(x_ptr + cols, mask=cols < K, other=0.0, cache_modifier=".cg")
        v = v.to(gl.float32)
        squares += gl.sum(gl.sum(v * v, axis=1), axis=0)
    scale = gl.rsqrt(squares / K + EPS)
    for p in gl.static_range(PARTS):
        cols = _columns(p, XL, CHUNKS, WIDTH)
        v = gl.load(x_ptr + cols, mask=cols < K, other=0.0, cache_modifier=".cg")
        nw = gl.load(nw_ptr + cols, mask=cols < K, other=0.0)
        xs.index(p).store(v.to(gl.float32) * scale * nw.to(gl.float32))


@gluon.jit
def _stage_gated(gu_ptr, xs, INTER: gl.constexpr, PARTS: gl.constexpr, XL: gl.constexpr,
                 CHUNKS: gl.constexpr, WIDTH: gl.constexpr):
    """down's x: SiLU(gate) x up from the raw fp32 rows, rounded to fp16 as the separate
    kernels store it, into shared memory."""
    for p in gl.static_range(PARTS):
        cols = _columns(p, XL, CHUNKS, WIDTH)
        g = gl.load(gu_ptr + cols, mask=cols < INTER, other=0.0, cache_modifier=".cg")
        u = gl.load(gu_ptr + INTER + cols, mask=cols < INTER, other=0.0,
                    cache_modifier=".cg")
        gated = g / (1.0 + gl.exp(-g)) * u
        xs.index(p).store(gated.to(gl.float16).to(gl.float32))


@gluon.jit
def _product(T0: gl.constexpr, TURNS: gl.constexpr, PARTS: gl.constexpr, N: gl.constexpr,
             xs, res_ptr, out_ptr, HAS_RES: gl.constexpr, ring, bars, wo_desc, wgu_desc,
             wd_desc, L3: gl.constexpr, PROGRAMS: gl.constexpr, ROWS: gl.constexpr,
             CHUNKS: gl.constexpr, WIDTH: gl.constexpr, SLOTS: gl.constexpr,
             TURNS_O: gl.constexpr, PARTS_O: gl.constexpr, TURNS_G: gl.constexpr,
             PARTS_G: gl.constexpr, TURNS_D: gl.constexpr, PARTS_D: gl.constexpr):
    """This program's row blocks of one product (its tiles T0, T0 + 1, ...): each tile
    taken from its slot into registers, the slot re-issued with the tile SLOTS on, then
    summed against x (from shared memory); a row block's rows stored (+ the residual)."""
    XL: gl.constexpr = gl.SliceLayout(0, L3)
    PL: gl.constexpr = gl.SliceLayout(1, L3)  # [ROWS, WIDTH]: a lane's sums over chunks
    RL: gl.constexpr = gl.SliceLayout(1, PL)
    if PARTS == 1:  # x the same for every tile: once
        x_once = xs.index(0).load(XL)
    for turn in range(TURNS):
        # summed over chunks inside each thread, across lanes once a row block
        acc = gl.zeros([ROWS, WIDTH], gl.float32, PL)
        for p in gl.static_range(PARTS):
            t = T0 + turn * PARTS + p
            slot = t % SLOTS
            mbarrier.wait(bars.index(slot), (t // SLOTS) & 1)
            w = ring.index(slot).load(L3)
            gl.thread_barrier()  # every warp's reads of the slot done: it may be refilled
            fence_async_shared()
            _issue(t + SLOTS, wo_desc, wgu_desc, wd_desc, ring, bars, PROGRAMS, ROWS,
                   CHUNKS, SLOTS, TURNS_O, PARTS_O, TURNS_G, PARTS_G, TURNS_D, PARTS_D)
            if PARTS == 1:
                x = x_once
            else:
                x = xs.index(p).load(XL)
            acc += gl.sum(w.to(gl.float32) * gl.expand_dims(x, 0), axis=1)
        y = gl.sum(acc, axis=1)
        rows = (gl.program_id(0) + turn * PROGRAMS) * ROWS + gl.arange(0, ROWS, layout=RL)
        if HAS_RES:
            y += gl.load(res_ptr + rows, mask=rows < N, other=0.0,
                         cache_modifier=".cg").to(gl.float32)
        gl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rows < N)


@gluon.jit
def stream_mlp_kernel(wo_desc, wgu_desc, wd_desc, a_ptr, h_ptr, nw_ptr, o_ptr, gu_ptr,
                      out_ptr, sync_ptr, stamps_ptr, EPS: gl.constexpr,
                      HIDDEN: gl.constexpr, INTER: gl.constexpr, PROGRAMS: gl.constexpr,
                      ROWS: gl.constexpr, CHUNKS: gl.constexpr, WIDTH: gl.constexpr,
                      LANES: gl.constexpr, SLOTS: gl.constexpr, XPARTS: gl.constexpr,
                      TURNS_O: gl.constexpr, PARTS_O: gl.constexpr,
                      TURNS_G: gl.constexpr, PARTS_G: gl.constexpr,
                      TURNS_D: gl.constexpr, PARTS_D: gl.constexpr, SPINS: gl.constexpr,
                      STAMPS: gl.constexpr, GDC: gl.constexpr):
    # a tile in registers: warps along rows, 16-byte pieces along a chunk's WIDTH
    # (LANES lanes), so a row's sum stays inside its warp
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 32 // LANES, LANES],
                                        [gl.num_warps(), 1, 1], [2, 1, 0])
    # x staged with warps along chunks: each value loaded once a program
    XS: gl.constexpr = gl.BlockedLayout([1, 8], [32 // LANES, LANES], [gl.num_warps(), 1],
                                        [1, 0])
    _stamp(stamps_ptr, 0, STAMPS)
    ring = gl.allocate_shared_memory(gl.float16, [SLOTS, ROWS, CHUNKS, WIDTH],
                                     wo_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    xs = gl.allocate_shared_memory(gl.float32, [XPARTS, CHUNKS, WIDTH],
                                   gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
    for i in gl.static_range(SLOTS):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()  # the barriers' init seen by the copy engine
    for i in gl.static_range(SLOTS):  # weights only: before the wait
        _issue(i, wo_desc, wgu_desc, wd_desc, ring, bars, PROGRAMS, ROWS, CHUNKS, SLOTS,
               TURNS_O, PARTS_O, TURNS_G, PARTS_G, TURNS_D, PARTS_D)
    if GDC:
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [],
                                  dtype=gl.int32, is_pure=False, pack=1)
    _stamp(stamps_ptr, 1, STAMPS)
    # o = a @ Wo.T + h
    _stage_plain(a_ptr, xs, HIDDEN, PARTS_O, XS, CHUNKS, WIDTH)
    gl.thread_barrier()
    _product(0, TURNS_O, PARTS_O, HIDDEN, xs, h_ptr, o_ptr, True, ring, bars, wo_desc,
             wgu_desc, wd_desc, L3, PROGRAMS, ROWS, CHUNKS, WIDTH, SLOTS, TURNS_O, PARTS_O,
             TURNS_G, PARTS_G, TURNS_D, PARTS_D)
    _stamp(stamps_ptr, 2, STAMPS)
    _grid_barrier(sync_ptr, PROGRAMS, SPINS)
    _stamp(stamps_ptr, 3, STAMPS)
    # gate and up rows, raw: g = norm(o) @ Wgu.T
    _stage_normed(o_ptr, nw_ptr, xs, EPS, HIDDEN, PARTS_G, XS, CHUNKS, WIDTH)
    gl.thread_barrier()
    _product(TURNS_O * PARTS_O, TURNS_G, PARTS_G, 2 * INTER, xs, gu_ptr, gu_ptr, False,
             ring, bars, wo_desc, wgu_desc, wd_desc, L3, PROGRAMS, ROWS, CHUNKS, WIDTH,
             SLOTS, TURNS_O, PARTS_O, TURNS_G, PARTS_G, TURNS_D, PARTS_D)
    _stamp(stamps_ptr, 4, STAMPS)
    _grid_barrier(sync_ptr, PROGRAMS, SPINS)
    _stamp(stamps_ptr, 5, STAMPS)
    if GDC:  # every program is resident by now: the next kernel may take free places
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r",
                                  [], dtype=gl.int32, is_pure=False, pack=1)
    # out = (SiLU(g) x u) @ Wd.T + o
    _stage_gated(gu_ptr, xs, INTER, PARTS_D, XS, CHUNKS, WIDTH)
    gl.thread_barrier()
    _product(TURNS_O * PARTS_O + TURNS_G * PARTS_G, TURNS_D, PARTS_D, HIDDEN, xs, o_ptr,
             out_ptr, True, ring, bars, wo_desc, wgu_desc, wd_desc, L3, PROGRAMS, ROWS,
             CHUNKS, WIDTH, SLOTS, TURNS_O, PARTS_O, TURNS_G, PARTS_G, TURNS_D, PARTS_D)
    _stamp(stamps_ptr, 6, STAMPS)
