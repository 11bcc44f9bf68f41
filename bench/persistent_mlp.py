"""A decoder layer's MLP half as one persistent Triton kernel: o (+ residual), then
RMSNorm + gate/up + SiLU x up, then down (+ residual), the math of three row_gemv calls
(reference.row_gemv) in a row.

A batch-1 decode step streams weights; between two kernels the GPU drains one grid and
ramps the next up. Here a grid of programs that are all resident at once (a few a
multiprocessor) takes its share of each product's rows in turn, with a grid-wide barrier
between the products. Before it waits at a barrier, each program loads the first
columns of its next rows' weights (no kernel of the step writes weights), so the next
product streams as soon as the barrier opens.

The barrier is one atomic a program and a spin: each counts itself in and waits until
the count reaches the next multiple of the grid. The count (an int32, zero to start
with, shared by every layer and call of one grid size) only grows, wrapping in 32 bits,
so the grid is a power of two; no program resets it (a reset needs one more round trip).

A deadlock needs programs that cannot be resident: ``persistent_grid`` sizes the grid by
the multiprocessors (and the launch refuses a compiled kernel that would not fit), and
the dependent form lets the kernel after it start only after the last barrier (its
programs could otherwise take the places of ours not yet started).

A timing tool, not part of the built library (which is why it lives in bench/): on an
H200 the 22-layer chain ran slower with it than with the three dependent launches (each
barrier costs about 2 us). bench/decode_chain_persistent.py times it and reads the
``stamps``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from targets.aoti.kernels.dependent_launch import declare_writes, launcher
from targets.aoti.kernels.row_parts import _column_sums, _finish, _first_sums, _first_tiles


_ACQUIRE = tl.constexpr("ld.acquire.gpu.global.b32 $0, [$1];")


@triton.jit
def _arrive(sync_ptr, PROGRAMS: tl.constexpr):
    """Counts this program in at a grid-wide barrier (releasing what it wrote); returns
    the count that opens it: the next multiple of PROGRAMS (the count only grows, and
    wraps in 32 bits: PROGRAMS a power of two)."""
    tl.debug_barrier()  # every thread's stores before the count: the release covers them
    seen = tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu").to(tl.uint32,
                                                                      bitcast=True)
    return (seen // PROGRAMS + 1) * PROGRAMS


@triton.jit
def _wait(sync_ptr, opens):
    """Until the count reaches ``opens`` (each thread's own acquiring reads, in L2)."""
    now = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu").to(tl.uint32, bitcast=True)
    while (now - opens).to(tl.int32, bitcast=True) < 0:
        now = tl.inline_asm_elementwise(_ACQUIRE, "=r,l", [sync_ptr.to(tl.int64)],
                                        dtype=tl.uint32, is_pure=False, pack=1)
    tl.debug_barrier()


@triton.jit
def _rows_block(x_ptr, w_ptr, nw_ptr, r_ptr, out_ptr, rows, w_first, u_first,
                EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                HAS_NORM: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD: tl.constexpr):
    """One block of a product's rows, stored: its first AHEAD columns' weights are
    ``w_first``/``u_first`` (loaded before), the rest loaded here."""
    row_ok = rows < N
    y = tl.zeros((BLOCK_N,), dtype=tl.float32)
    u = tl.zeros((BLOCK_N,), dtype=tl.float32)
    square_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if AHEAD > 0:
        y, u_sums, squares = _first_sums(x_ptr, nw_ptr, w_first, u_first, OFFSET, K,
                                         HAS_NORM, ACT, AHEAD)
        square_sum += squares
        if ACT != 0:
            u = u_sums
    y_rest, up, squares_rest = _column_sums(x_ptr, w_ptr, nw_ptr, rows, row_ok, OFFSET, N,
                                            K, BLOCK_N, BLOCK_K, HAS_NORM, ACT, AHEAD,
                                            False)
    y = _finish(y + y_rest, u, up, square_sum + squares_rest, w_ptr, r_ptr, w_ptr, w_ptr,
                w_ptr, rows, row_ok, EPS, N, K, False, HAS_NORM, ACT, HAS_RES, False,
                BLOCK_N, 0, 0)
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def _stamp(stamps_ptr, at: tl.constexpr, STAMPS: tl.constexpr):
    """With STAMPS, the GPU's clock (ns) now, as this program's ``at``-th of 8 stamps."""
    if STAMPS:
        now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r",
                                        [tl.program_id(0)], dtype=tl.int64, is_pure=False,
                                        pack=1)
        tl.store(stamps_ptr + tl.program_id(0) * 8 + at, now)


@triton.jit
def _product(x_ptr, w_ptr, nw_ptr, r_ptr, out_ptr, w_first, u_first, EPS: tl.constexpr,
             OFFSET: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
             HAS_NORM: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
             PROGRAMS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             AHEAD: tl.constexpr):
    """This program's blocks of a product's rows: its first (the program's number), whose
    first columns were loaded ahead, then every PROGRAMS-th after it. Each turn loads the
    next block's first columns before it reduces its own: a program alone on its
    multiprocessor keeps its loads in flight instead of waiting out each block's."""
    pid = tl.program_id(0)
    lanes = tl.arange(0, BLOCK_N)
    w, u = w_first, u_first
    # a count known when compiling; a program short of a block masks its last one
    for turn in range(tl.cdiv(tl.cdiv(N, BLOCK_N), PROGRAMS)):
        rows = (pid + turn * PROGRAMS) * BLOCK_N + lanes
        after = rows + PROGRAMS * BLOCK_N
        w_next, u_next = _first_tiles(w_ptr, after, after < N, N, K, ACT, AHEAD)
        _rows_block(x_ptr, w_ptr, nw_ptr, r_ptr, out_ptr, rows, w, u, EPS, OFFSET, N, K,
                    HAS_NORM, ACT, HAS_RES, BLOCK_N, BLOCK_K, AHEAD)
        w, u = w_next, u_next


@triton.jit
def _first_of(w_ptr, N: tl.constexpr, K: tl.constexpr, ACT: tl.constexpr,
              BLOCK_N: tl.constexpr, AHEAD: tl.constexpr):
    """This program's first block of a product: its first AHEAD columns of weights."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    return _first_tiles(w_ptr, rows, rows < N, N, K, ACT, AHEAD)


@triton.jit
def _mlp_half(a_ptr, h_ptr, wo_ptr, nw_ptr, wgu_ptr, wd_ptr, o_ptr, g_ptr, out_ptr,
              sync_ptr, stamps_ptr, EPS: tl.constexpr, OFFSET: tl.constexpr,
              HIDDEN: tl.constexpr, INTER: tl.constexpr, ACT: tl.constexpr,
              PROGRAMS: tl.constexpr, BN_O: tl.constexpr, BK_O: tl.constexpr,
              AHEAD_O: tl.constexpr, BN_G: tl.constexpr, BK_G: tl.constexpr,
              AHEAD_G: tl.constexpr, BN_D: tl.constexpr, BK_D: tl.constexpr,
              AHEAD_D: tl.constexpr, STAMPS: tl.constexpr, GDC: tl.constexpr):
    _stamp(stamps_ptr, 0, STAMPS)
    w, u = _first_of(wo_ptr, HIDDEN, HIDDEN, 0, BN_O, AHEAD_O)
    if GDC:
        tl.extra.cuda.gdc_wait()
    _stamp(stamps_ptr, 1, STAMPS)
    # o = a @ Wo.T + h
    _product(a_ptr, wo_ptr, nw_ptr, h_ptr, o_ptr, w, u, EPS, OFFSET, HIDDEN, HIDDEN, False,
             0, True, PROGRAMS, BN_O, BK_O, AHEAD_O)
    _stamp(stamps_ptr, 2, STAMPS)
    opens = _arrive(sync_ptr, PROGRAMS)
    w, u = _first_of(wgu_ptr, INTER, HIDDEN, ACT, BN_G, AHEAD_G)
    _wait(sync_ptr, opens)
    _stamp(stamps_ptr, 3, STAMPS)
    # g = act(norm(o) @ Wg.T) * (norm(o) @ Wu.T)
    _product(o_ptr, wgu_ptr, nw_ptr, h_ptr, g_ptr, w, u, EPS, OFFSET, INTER, HIDDEN, True,
             ACT, False, PROGRAMS, BN_G, BK_G, AHEAD_G)
    _stamp(stamps_ptr, 4, STAMPS)
    opens = _arrive(sync_ptr, PROGRAMS)
    w, u = _first_of(wd_ptr, HIDDEN, INTER, 0, BN_D, AHEAD_D)
    _wait(sync_ptr, opens)
    _stamp(stamps_ptr, 5, STAMPS)
    if GDC:  # every program is resident by now: the next kernel may take free places
        tl.extra.cuda.gdc_launch_dependents()
    # out = g @ Wd.T + o
    _product(g_ptr, wd_ptr, nw_ptr, o_ptr, out_ptr, w, u, EPS, OFFSET, HIDDEN, INTER, False,
             0, True, PROGRAMS, BN_D, BK_D, AHEAD_D)
    _stamp(stamps_ptr, 6, STAMPS)


@triton.jit
def persistent_mlp_kernel(a_ptr, h_ptr, wo_ptr, nw_ptr, wgu_ptr, wd_ptr, o_ptr, g_ptr,
                          out_ptr, sync_ptr, stamps_ptr, EPS: tl.constexpr,
                          OFFSET: tl.constexpr, HIDDEN: tl.constexpr, INTER: tl.constexpr,
                          ACT: tl.constexpr,
                          PROGRAMS: tl.constexpr, BN_O: tl.constexpr, BK_O: tl.constexpr,
                          AHEAD_O: tl.constexpr, BN_G: tl.constexpr, BK_G: tl.constexpr,
                          AHEAD_G: tl.constexpr, BN_D: tl.constexpr, BK_D: tl.constexpr,
                          AHEAD_D: tl.constexpr, STAMPS: tl.constexpr):
    _mlp_half(a_ptr, h_ptr, wo_ptr, nw_ptr, wgu_ptr, wd_ptr, o_ptr, g_ptr, out_ptr,
              sync_ptr, stamps_ptr, EPS, OFFSET, HIDDEN, INTER, ACT, PROGRAMS, BN_O, BK_O,
              AHEAD_O, BN_G, BK_G, AHEAD_G, BN_D, BK_D, AHEAD_D, STAMPS, False)


@triton.jit
def persistent_mlp_kernel_gdc(a_ptr, h_ptr, wo_ptr, nw_ptr, wgu_ptr, wd_ptr, o_ptr, g_ptr,
                              out_ptr, sync_ptr, stamps_ptr, EPS: tl.constexpr,
                              OFFSET: tl.constexpr,
                              HIDDEN: tl.constexpr, INTER: tl.constexpr,
                              ACT: tl.constexpr, PROGRAMS: tl.constexpr,
                              BN_O: tl.constexpr, BK_O: tl.constexpr,
                              AHEAD_O: tl.constexpr, BN_G: tl.constexpr,
                              BK_G: tl.constexpr, AHEAD_G: tl.constexpr,
                              BN_D: tl.constexpr, BK_D: tl.constexpr,
                                  AHEAD_D: tl.constexpr, STAMPS: tl.constexpr):
    _mlp_half(a_ptr, h_ptr, wo_ptr, nw_ptr, wgu_ptr, wd_ptr, o_ptr, g_ptr, out_ptr,
              sync_ptr, stamps_ptr, EPS, OFFSET, HIDDEN, INTER, ACT, PROGRAMS, BN_O, BK_O,
              AHEAD_O, BN_G, BK_G, AHEAD_G, BN_D, BK_D, AHEAD_D, STAMPS, True)


# not sync_ptr: its count is only ever a multiple of the grid between calls
declare_writes(persistent_mlp_kernel_gdc, "o_ptr", "g_ptr", "out_ptr")

# (programs a multiprocessor, warps, (BLOCK_N, BLOCK_K, AHEAD) for o, gate/up, down)
DEFAULT_CONFIG = (2, 8, (8, 512, 2048), (2, 512, 2048), (8, 512, 2048))


def persistent_grid(device: torch.device, per_sm: int) -> int:
    """Programs that are all resident at once: ``per_sm`` a multiprocessor (1 everywhere
    off a GPU, where the interpreter runs programs one after the other)."""
    if device.type != "cuda":
        return 1
    fits = torch.cuda.get_device_properties(device).multi_processor_count * per_sm
    return 1 << (fits.bit_length() - 1)  # a power of two: the barrier's count wraps


def resident_per_sm(compiled, device: torch.device) -> int:
    """How many programs of a compiled kernel (Triton's CompiledKernel) a multiprocessor
    holds at once, by its registers (8 a thread at a time), shared memory and threads."""
    props = torch.cuda.get_device_properties(device)
    threads = compiled.metadata.num_warps * 32
    by_regs = props.regs_per_multiprocessor // (threads * -(-max(compiled.n_regs, 1) // 8) * 8)
    by_threads = props.max_threads_per_multi_processor // threads
    shared = compiled.metadata.shared
    by_shared = props.shared_memory_per_multiprocessor // shared if shared else by_threads
    return min(by_regs, by_threads, by_shared)


_checked: dict = {}


def _check_resident(kernel, grid: int, args: tuple, constants: dict, device) -> None:
    """A grid larger than what the GPU holds at once would wait at its first barrier
    forever: compiled (not launched) once a configuration, and refused if so."""
    key = (kernel, grid, tuple(sorted(constants.items())), device)
    if key not in _checked:
        compiled = kernel.warmup(*args, grid=(grid,), **constants)
        compiled._init_handles()  # loaded: its registers known
        _checked[key] = (resident_per_sm(compiled, device), compiled.n_regs,
                         compiled.n_spills)
    per_sm, regs, spills = _checked[key]
    if grid > per_sm * torch.cuda.get_device_properties(device).multi_processor_count:
        raise ValueError(f"persistent grid of {grid} programs: only {per_sm} a "
                         f"multiprocessor fit ({regs} registers a thread)")


def persistent_resources() -> dict:
    """(programs a multiprocessor that fit, registers, spills) of each checked launch."""
    return dict(_checked)


def _within(columns: int, cols: int) -> int:
    """A power-of-two span of columns, no wider than ``cols`` needs."""
    return min(columns, triton.next_power_of_2(cols))


def launch_persistent_mlp(attn, hidden, o_weight, norm_weight, gate_up_weight,
                          down_weight, sync, eps: float, offset: float = 0.0, act: int = 1,
                          config: tuple | None = None, pdl: bool = False,
                          programs: int | None = None, stamps: torch.Tensor | None = None):
    """(o, out): ``o = attn @ o_weight.T + hidden``, then ``out = down(act(gate(norm(o)))
    * up(norm(o))) + o`` (gate_up_weight: the gate rows, then the up rows). ``sync``:
    int32 zeros (one is the barrier's count, which the kernel leaves a multiple of the
    grid: one buffer for all calls of one grid size).
    ``config``: DEFAULT_CONFIG's layout; ``programs``: the grid (by default persistent_grid's); ``stamps``: int64, 8 a
    program, the GPU clock at each stage's end (a timing script's)."""
    per_sm, warps, (bn_o, bk_o, ahead_o), (bn_g, bk_g, ahead_g), (bn_d, bk_d, ahead_d) = (
        config or DEFAULT_CONFIG)
    width, inter = o_weight.shape[0], down_weight.shape[1]
    programs = programs or persistent_grid(attn.device, per_sm)
    if programs & (programs - 1):
        raise ValueError(f"a persistent grid of {programs} programs: not a power of two")
    o = torch.empty((*hidden.shape[:-1], width), dtype=hidden.dtype, device=hidden.device)
    gated = torch.empty(inter, dtype=hidden.dtype, device=hidden.device)
    out = torch.empty_like(o)
    launch, gdc = launcher(persistent_mlp_kernel, persistent_mlp_kernel_gdc, attn.device,
                           pdl)
    args = (attn.reshape(-1).contiguous(), hidden.reshape(-1).contiguous(),
            o_weight.contiguous(), norm_weight, gate_up_weight.contiguous(),
            down_weight.contiguous(), o, gated, out, sync,
            sync if stamps is None else stamps)
    constants = dict(
        EPS=eps, OFFSET=offset, HIDDEN=width, INTER=inter, ACT=act, PROGRAMS=programs,
        BN_O=bn_o, BK_O=_within(bk_o, width), AHEAD_O=_within(ahead_o, width), BN_G=bn_g,
        BK_G=_within(bk_g, width), AHEAD_G=_within(ahead_g, width), BN_D=bn_d,
        BK_D=_within(bk_d, inter), AHEAD_D=_within(ahead_d, inter),
        STAMPS=stamps is not None,
        num_warps=warps,
        # registers capped so that per_sm programs fit a multiprocessor's 64K
        maxnreg=min(255, 65536 // (per_sm * warps * 32) // 8 * 8))
    if attn.device.type == "cuda" and not torch.compiler.is_compiling():
        _check_resident(persistent_mlp_kernel_gdc if gdc else persistent_mlp_kernel,
                        programs, args, constants, attn.device)
    launch((programs,))(*args, **constants)
    return o, out
