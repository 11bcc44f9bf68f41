"""decode_chain_cuda.py's variants that prefetch a layer's next weights into L2 from a side
branch of the chain's CUDA graph: a kernel on a second stream, forked when the layer's
q/k/v or attention starts and joined only after the head, so no kernel of the chain
waits for it. Prefetching from inside the attention kernel made the attention last until
its prefetches landed; on a branch of its own the prefetch only shares the memory.

A span is (which weight, first byte, bytes): the o rows, or the first rows of gate and of
up (a gated product's programs start at its first rows of both). Two ways to ask L2:
``bulk``, ``cp.async.bulk.prefetch.L2.global`` (one chunk a thread, fetched by the copy
engine, no registers held); ``line``, ``prefetch.global.L2::evict_last`` (one 128-byte
line an instruction).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_ASM = {"bulk": "cp.async.bulk.prefetch.L2.global [$1], {chunk};\n\tmov.u32 $0, 0;",
        "line": "prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;"}


@triton.jit
def _prefetch_l2_kernel(ptr, flag_ptr, chunks, CHUNK: tl.constexpr,
                        ASM: tl.constexpr, THREADS: tl.constexpr):
    """Asks L2 for ``chunks`` chunks of CHUNK bytes from ``ptr`` (a byte pointer), dealt to the
    grid's threads in turn; the asm's zero results are stored nowhere unless they are not
    zero (so the compiler keeps the asm without a store a thread)."""
    done = tl.zeros((THREADS,), dtype=tl.int32)
    first = tl.program_id(0) * THREADS
    for start in range(first, chunks, tl.num_programs(0) * THREADS):
        # past the end: the last chunk again (harmless), so the asm needs no predicate
        idx = tl.minimum(start + tl.arange(0, THREADS), chunks - 1)
        at = (ptr + idx.to(tl.int64) * CHUNK).to(tl.int64)
        done += tl.inline_asm_elementwise(ASM, "=r,l", [at], dtype=tl.int32,
                                          is_pure=False, pack=1)
    total = tl.sum(done, axis=0)
    tl.store(flag_ptr + tl.program_id(0), total, mask=total != 0)


def prefetch_l2(weight: torch.Tensor, start: int, nbytes: int, programs: int,
                mode: str = "bulk", chunk: int = 4096, flag: torch.Tensor | None = None):
    """Asks L2 for ``nbytes`` of ``weight``'s bytes from byte ``start`` (``chunk`` bytes a
    thread at a time; ``line`` mode: 128); nbytes 0 launches a kernel that asks for none
    (an empty branch)."""
    chunk = 128 if mode == "line" else chunk
    data = weight.view(-1).view(torch.uint8)[start:start + nbytes]
    flag = flag if flag is not None else torch.zeros(programs, dtype=torch.int32,
                                                     device=weight.device)
    if nbytes == 0:
        return _empty_kernel[(1,)](flag, num_warps=1)
    _prefetch_l2_kernel[(programs,)](data, flag, triton.cdiv(nbytes, chunk),
                                     CHUNK=chunk, ASM=_ASM[mode].format(chunk=chunk),
                                     THREADS=128, num_warps=4)


@triton.jit
def _empty_kernel(flag_ptr):
    """Nothing: the side branch's cost alone (its fork, its join)."""
    pass


def spans(layer: dict, o: bool, gate_up_mb: float, down_mb: float = 0.0) -> list:
    """(weight, first byte, bytes) of a layer's weights to prefetch: all of o's rows, the
    first ``gate_up_mb`` MB of gate/up (half from the gate rows' start, half from the up
    rows'), the first ``down_mb`` MB of down."""
    found = []
    if o:
        weight = layer["o"][0]
        found.append((weight, 0, weight.numel() * weight.element_size()))
    if gate_up_mb:
        weight = layer["gate_up"][0]
        half = weight.numel() * weight.element_size() // 2
        each = min(half, int(gate_up_mb * 1e6 / 2)) // 16384 * 16384
        found += [(weight, 0, each), (weight, half, each)]
    if down_mb:
        weight = layer["down"][0]
        found.append((weight, 0, int(down_mb * 1e6) // 16384 * 16384))
    return found


class SideBranch:
    """step()'s hook: at ``fork`` ("qkv" or "attention") of each layer, a second stream
    waits for the chain so far and prefetches the layer's spans; the chain waits for that
    stream only at "end" (after the head). ``empty``: the branch with a kernel that reads
    nothing (the fork's own cost, and whether dependent launches keep their edges)."""

    def __init__(self, fork: str = "attention", o: bool = True, gate_up_mb: float = 0.0,
                 down_mb: float = 0.0, programs: int = 32, mode: str = "bulk",
                 chunk: int = 4096, empty: bool = False):
        self.fork, self.o, self.gate_up_mb, self.down_mb = fork, o, gate_up_mb, down_mb
        self.programs, self.mode, self.chunk, self.empty = programs, mode, chunk, empty
        self.side = self.flag = None

    def __call__(self, stage: str, layer: dict | None) -> None:
        if self.side is None:  # made on the first (eager) call, not while capturing
            self.side = torch.cuda.Stream()
            self.flag = torch.zeros(self.programs, dtype=torch.int32, device="cuda")
        main = torch.cuda.current_stream()
        if stage == "end":
            main.wait_stream(self.side)
        elif stage == self.fork:
            self.side.wait_stream(main)
            with torch.cuda.stream(self.side):
                if self.empty:
                    prefetch_l2(layer["o"][0], 0, 0, 1, flag=self.flag)
                    return
                for weight, start, nbytes in spans(layer, self.o, self.gate_up_mb,
                                                   self.down_mb):
                    prefetch_l2(weight, start, nbytes, self.programs, self.mode,
                                self.chunk, self.flag)


def prefetch_variants(default: dict) -> dict:
    """decode_chain_cuda.variants()'s entries for the side branch: (pdl, configs, cache
    ahead, join, block_s, hook), each against "dependent + join" (names without commas,
    for ``--variants``)."""
    def entry(**branch):
        return (True, default, None, True, None, SideBranch(**branch))

    def name(o=True, gate_up_mb=0, down_mb=0, programs=32, mode="bulk", chunk=4096,
             fork="attention"):
        what = " + ".join(["o"] * o + [f"{gate_up_mb} MB gate/up"] * bool(gate_up_mb)
                          + [f"{down_mb} MB down"] * bool(down_mb))
        return (f"side prefetch {what} / {mode} / {programs} programs"
                + (f" / {chunk // 1024} KB chunks" if chunk != 4096 and mode == "bulk" else "")
                + (" / at q/k/v" if fork == "qkv" else ""))
    made = {"dependent + join + empty side branch": entry(empty=True),
            "dependent + join + empty side branch at q/k/v": entry(empty=True, fork="qkv")}
    tried = [dict(programs=8), dict(), dict(programs=132),
             dict(gate_up_mb=8), dict(gate_up_mb=8, fork="qkv"), dict(gate_up_mb=16),
             dict(gate_up_mb=16, fork="qkv"), dict(o=False, gate_up_mb=16),
             dict(gate_up_mb=8, down_mb=4), dict(gate_up_mb=8, chunk=16384),
             dict(mode="line"), dict(gate_up_mb=8, mode="line", programs=132)]
    for branch in tried:
        made[name(**branch)] = entry(**branch)
    return made

