"""decode_chain_cuda.py's variants that wait for the kernel before by a flag instead of
``gdc_wait`` at some of a layer's boundaries (bench/flag_wait_triton.py): the kernel
before counts its programs in after their stores, the kernel after spins on the count.
Each variant is "dependent + join" (the built library's configurations) with the flag at
the boundaries it names:

    python bench/decode_chain_cuda.py --rounds 30 --variants "dependent + join,dependent
        + join + flag everywhere,..."      (on the GPU machine)

A boundary is named by the kernels on its two sides: qkv>attention, attention>o,
o>gate_up, gate_up>down and down>next (the next layer's q/k/v, or the head). The step's
first launch waits by gdc_wait (the step before is no flag's). "flag kernels without a
flag" is the bench's copies of the kernels with gdc_wait everywhere: what the copies
alone change. A bench tool only: on the H200 no flag made the chain faster.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BOUNDARIES = ("qkv>attention", "attention>o", "o>gate_up", "gate_up>down", "down>next")
# the boundary into each place (q/k/v and the head: from the down before)
_INTO = {"qkv": "down>next", "attention": "qkv>attention", "o": "attention>o",
         "gate_up": "o>gate_up", "down": "gate_up>down", "head": "down>next"}
_OUT = {"qkv": "qkv>attention", "attention": "attention>o", "o": "o>gate_up",
        "gate_up": "gate_up>down", "down": "down>next"}


class FlagChain:
    """One step's launches in order, each given its slot (its launch's index + 1; slot 0
    counts polls given up): whether it spins on the launch before's slot, counts itself
    in on its own, and which slot it zeroes. Shared by a variant's places; the buffer is
    made on the first call and left as the next step needs it."""

    def __init__(self, flagged, configs: dict, poll: int = 1, ns: int = 64,
                 slots: int = 256, subs: int = 1):
        from bench.flag_wait_triton import SLOT_SUBS
        if subs & (subs - 1) or not 1 <= subs <= SLOT_SUBS:
            raise ValueError(f"counters a slot: a power of two up to {SLOT_SUBS}, not {subs}")
        self.flagged, self.configs = frozenset(flagged), configs
        # every counter of a slot polled by a thread of its own
        self.poll, self.ns, self.slots, self.subs = max(poll, subs), ns, slots, subs
        self.flags = None
        self.index, self.before = 0, None  # (slot, count it reaches, whether it spun)
        self.last_wait = None  # the slot the step's last launch spun on

    def slot(self, index: int) -> torch.Tensor:
        from bench.flag_wait_triton import SLOT_SUBS, STRIDE
        return self.flags[index * SLOT_SUBS * STRIDE:]

    def plan(self, place: str, device) -> dict:
        """The launch's slot arguments and constexprs; the chain moves on to it."""
        if self.flags is None:
            from bench.flag_wait_triton import SLOT_SUBS, STRIDE
            self.flags = torch.zeros(self.slots * SLOT_SUBS * STRIDE, dtype=torch.int32,
                                     device=device)
        index = self.index
        if index + 2 >= self.slots:
            raise ValueError(f"a step of more than {self.slots - 2} launches")
        wait = index > 0 and _INTO[place] in self.flagged
        reset = self.before[2] if index > 0 and self.before[2] else (
            self.last_wait if index == 0 else None)
        found = dict(wait_ptr=self.slot(index) if wait else self.flags,
                     reset_ptr=self.flags if reset is None else self.slot(reset),
                     count_ptr=self.slot(index + 1), err_ptr=self.flags,
                     WAIT_FLAG=wait, RESET=reset is not None,
                     ARRIVE=place in _OUT and _OUT[place] in self.flagged,
                     TARGET=self.before[1] if wait else 1, POLL=self.poll, NS=self.ns,
                     SUBS=self.subs)
        self.index += 1
        return found, index

    def moved(self, index: int, count: int, waited: bool, place: str) -> None:
        """After a launch: the count its slot reaches; after the head, the step's end."""
        self.before = (index + 1, count, index if waited else None)
        if place == "head":
            self.last_wait = self.before[2]
            self.index, self.before = 0, None
            if self.flags.device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
                self.check()

    def check(self) -> None:
        """Raises where a program gave up waiting (a bug: a count never reached)."""
        if self.flags is not None and self.flags.device.type == "cuda":
            torch.cuda.synchronize()
        if self.flags is not None and int(self.flags[0]):
            raise RuntimeError(f"{int(self.flags[0])} flag waits gave up: a count was "
                               "never reached")

    def plain_step_done(self, place: str) -> None:
        if place == "head":
            self.index, self.before = 0, None


class FlagLaunch:
    """A chain configuration that is a launch of its own (decode_chain_cuda.step): a
    place's kernel with the FlagChain's waits; plain launches as the library's."""

    def __init__(self, chain: FlagChain, place: str):
        self.chain, self.place = chain, place

    def __repr__(self) -> str:  # the row's "configs" in the bench's JSON
        return (f"flag({self.place}, {sorted(self.chain.flagged)}, poll "
                f"{self.chain.poll}, {self.chain.ns} ns, {self.chain.subs} counters)")

    def __call__(self, x, weight, scale, fold: dict, pdl: bool) -> torch.Tensor:
        from targets.aoti.kernels.triton_kernels import launch_row_gemv
        config = self.chain.configs[self.place]
        if not pdl:
            self.chain.plain_step_done(self.place)
            return launch_row_gemv(x, weight, None, fold.get("norm"), fold.get("residual"),
                                   1e-5, 0.0, fold.get("act", 0), config, False, scale)
        if scale is not None:
            raise ValueError("the flag kernels take fp16 rows only")
        return launch_flag_gemv(self.chain, self.place, x, weight, fold, config)

    def attention(self, q, k, v, layer: dict, made: dict, pdl: bool) -> torch.Tensor:
        from targets.aoti.kernels.decode_attention import launch_decode_attention
        if not pdl:
            return launch_decode_attention(q, layer["k"], k, layer["v"], v, made["mask"],
                                           q.shape[-1] ** -0.5, counts=made["counts"])
        return launch_flag_attention(self.chain, q, layer["k"], k, layer["v"], v,
                                     made["mask"], made["counts"])


def launch_flag_gemv(chain: FlagChain, place: str, x, weight, fold: dict, config: tuple):
    """The place's row kernel (gate/up: the row loop) as a dependent launch."""
    from bench.flag_wait_triton import row_gemv_flag_kernel, row_loop_flag_kernel
    block_n, block_k, warps, ahead, *loop = config
    turns = (*loop, False, 0)[1]
    act = fold.get("act", 0)
    width, cols = weight.shape[0] // (2 if act else 1), weight.shape[1]
    out = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)
    flags, index = chain.plan(place, x.device)
    norm, residual = fold.get("norm"), fold.get("residual")
    blocks = triton.cdiv(width, block_n)
    if turns:
        grid = triton.cdiv(blocks, turns)
        row_loop_flag_kernel[(grid,)](
            x.reshape(cols), weight, norm, out, **flags, EPS=1e-5, N=width, K=cols, ACT=act,
            BLOCK_N=block_n, BLOCK_K=block_k, AHEAD=ahead, TURNS=turns, num_warps=warps,
            launch_pdl=True)
    else:
        grid = blocks
        if act or not ahead:
            raise ValueError("the one-block flag kernel: not gated, AHEAD > 0")
        row_gemv_flag_kernel[(grid,)](
            x.reshape(cols), weight, weight if norm is None else norm,
            weight if residual is None else residual.reshape(width), out, **flags,
            EPS=1e-5, N=width, K=cols, HAS_NORM=norm is not None,
            HAS_RES=residual is not None, BLOCK_N=block_n, BLOCK_K=block_k, AHEAD=ahead,
            num_warps=warps, launch_pdl=True)
    chain.moved(index, grid, flags["WAIT_FLAG"], place)
    return out


def launch_flag_attention(chain: FlagChain, query, past_k, new_k, past_v, new_v, mask,
                          counts):
    """decode_attention's joined split kernel (32 slots a block, fp16) with flags."""
    from bench.flag_wait_triton import attention_flag_kernel
    heads, dim = query.shape[1], query.shape[-1]
    kv_heads, slots = past_k.shape[1], past_k.shape[2]
    groups = heads // kv_heads
    block_s = 32 if slots <= 1024 else 64 if slots <= 4096 else 128
    splits = triton.cdiv(slots, block_s)
    block_d = max(16, triton.next_power_of_2(dim))
    join_g = triton.next_power_of_2(groups)
    block_j = min(max(2, triton.next_power_of_2(splits)), max(2, 8192 // (join_g * block_d)))
    tops = torch.empty((heads * splits,), dtype=torch.float32, device=query.device)
    sums = torch.empty_like(tops)
    accs = torch.empty((heads * splits, block_d), dtype=torch.float32, device=query.device)
    out = torch.empty((1, heads, 1, dim), dtype=query.dtype, device=query.device)
    flags, index = chain.plan("attention", query.device)
    attention_flag_kernel[(kv_heads, splits)](
        query, past_k, new_k, past_v, new_v, mask, tops, sums, accs, counts, out, **flags,
        sq_h=query.stride(1), spk_h=past_k.stride(1), spk_s=past_k.stride(2),
        snk_h=new_k.stride(1), spv_h=past_v.stride(1), spv_s=past_v.stride(2),
        snv_h=new_v.stride(1), sm=mask.stride(-1), SCALE=float(dim ** -0.5), S=slots,
        D=dim, G=groups, SPLITS=splits, BLOCK_S=block_s,
        BLOCK_G=max(16, triton.next_power_of_2(groups)), BLOCK_D=block_d, JOIN_G=join_g,
        BLOCK_J=block_j, num_warps=4, launch_pdl=True)
    # only each key/value head's joining program counts in
    chain.moved(index, kv_heads, flags["WAIT_FLAG"], "attention")
    return out


def flag_configs(default: dict, flagged, poll: int = 1, ns: int = 64,
                 subs: int = 1) -> dict:
    """The places' configurations of a variant: each a FlagLaunch over one FlagChain."""
    chain = FlagChain(flagged, default, poll, ns, subs=subs)
    configs = {place: FlagLaunch(chain, place) for place in default}
    configs["attention"] = FlagLaunch(chain, "attention")
    return configs


# name -> (boundaries flagged, threads polling, ns between polls, counters a slot); by
# default one thread a program polls one counter, 64 ns apart; every form lost to gdc_wait
CHANGES = {
    "flag kernels without a flag": ((), 1, 64, 1),
    **{f"flag {b}": ((b,), 1, 64, 1) for b in BOUNDARIES},
    "flag everywhere": (BOUNDARIES, 1, 64, 1),
    "flag everywhere warp 0 polls": (BOUNDARIES, 32, 64, 1),
    "flag everywhere every thread polls": (BOUNDARIES, 1 << 16, 64, 1),
    "flag everywhere 256 ns between polls": (BOUNDARIES, 1, 256, 1),
    "flag everywhere no sleep": (BOUNDARIES, 1, 0, 1),
    **{f"flag everywhere {n} counters": (BOUNDARIES, n, 64, n) for n in (4, 8, 16, 32)},
    **{f"flag {b} 16 counters": ((b,), 16, 64, 16) for b in BOUNDARIES},
}


def flag_variants(default: dict) -> dict:
    """decode_chain_cuda.variants()'s entries: "dependent + join" with CHANGES' flags
    (each variant its own FlagChain and buffer)."""
    return {f"dependent + join + {name}": (True, flag_configs(
        default, flagged, poll, ns, subs), None, True)
        for name, (flagged, poll, ns, subs) in CHANGES.items()}


_STRIDES = ("sq_h", "spk_h", "spk_s", "snk_h", "spv_h", "spv_s", "snv_h", "sm")


def _compiled_places() -> dict:
    """place -> (flag kernel, argument types, constexprs, warps, the library's kernel) of
    the ~1.1B's places: gemv_config's dependent configurations on 132 multiprocessors,
    flagged in and out."""
    from bench import flag_wait_triton as f
    from targets.aoti.kernels.decode_attention import attention_join_kernel_gdc
    from targets.aoti.kernels.row_loop_triton import row_loop_kernel_gdc
    from targets.aoti.kernels.triton_kernels import gemv_config, row_gemv_kernel_gdc
    flag = dict(WAIT_FLAG=True, RESET=True, ARRIVE=True, POLL=1, NS=64, TARGET=512)
    found = {}
    for place, (n, k, norm, res) in {"qkv": (2560, 2048, True, False),
                                     "o": (2048, 2048, False, True),
                                     "down": (2048, 5632, False, True)}.items():
        block_n, block_k, warps, ahead = gemv_config(n, k, False, True, 2, 132)
        shape = dict(EPS=1e-5, N=n, K=k, HAS_NORM=norm, HAS_RES=res, BLOCK_N=block_n,
                     BLOCK_K=block_k, AHEAD=ahead)
        found[place] = (f.row_gemv_flag_kernel, {}, {**shape, **flag}, warps,
                        (row_gemv_kernel_gdc, dict(
                            OFFSET=0.0, HAS_BIAS=False, ACT=0, HAS_SCALE=False, W_AHEAD=True,
                            TILE_X=False, ROT_ROWS=0, HEAD_D=0, **shape)))
    block_n, block_k, warps, ahead, _, turns = gemv_config(5632, 2048, True, True, 2, 132)
    loop = dict(EPS=1e-5, N=5632, K=2048, ACT=1, BLOCK_N=block_n, BLOCK_K=block_k,
                AHEAD=ahead, TURNS=turns)
    found["gate_up"] = (f.row_loop_flag_kernel, {}, {**loop, **flag}, warps, (
        row_loop_kernel_gdc, dict(OFFSET=0.0, HAS_BIAS=False, HAS_NORM=True, HAS_RES=False,
                                  HAS_SCALE=False, W_AHEAD=True, ROT_ROWS=0, HEAD_D=0,
                                  **loop)))
    sizes = dict(SCALE=0.125, S=512, D=64, G=8, SPLITS=16, BLOCK_S=32, BLOCK_G=16,
                 BLOCK_D=64, JOIN_G=8, BLOCK_J=16)
    found["attention"] = (f.attention_flag_kernel, {
        "m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32", "counts_ptr": "*i32",
        **{a: "i32" for a in _STRIDES}}, {**sizes, **flag}, 4, (
        attention_join_kernel_gdc, dict(IEEE=False, CACHE_AHEAD=True, **sizes)))
    return found


def _sm90_ptx(kernel, kinds: dict, values: dict, warps: int) -> str:
    """int4_rows_ptx.sm90_ptx with integer arguments too (``kinds``: "i32")."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    names = kernel.arg_names
    signature = {a: kinds.get(a, "*fp16") for a in names
                 if a.endswith("_ptr") or a in kinds}
    signature.update({a: "constexpr" for a in values})
    source = ASTSource(kernel, signature,
                       constexprs={(names.index(a),): v for a, v in values.items()},
                       attrs={(i,): [["tt.divisibility", 16]]
                              for i, a in enumerate(names) if a.endswith("_ptr")})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps}).asm["ptx"]


def main() -> None:
    """Each place's flag kernel compiled for sm_90a here (no GPU): registers against the
    library's ``_gdc`` kernel's, and its PTX's order (weight loads, the poll, the count)."""
    from bench.int4_rows_ptx import registers
    for place, (kernel, kinds, values, warps, (library, shape)) in _compiled_places().items():
        kinds = {"wait_ptr": "*i32", "reset_ptr": "*i32", "count_ptr": "*i32",
                 "err_ptr": "*i32", **kinds}
        own = registers(_sm90_ptx(library, kinds, shape, warps))
        for poll in (1, 32):
            ptx = _sm90_ptx(kernel, kinds, {**values, "POLL": poll}, warps)
            order = [("w" if "evict_first" in line else "poll" if "ld.acquire" in line
                      else "count" if "atom.global.gpu.release" in line else "wait")
                     for line in ptx.splitlines()
                     if "evict_first" in line or "ld.acquire" in line
                     or "atom.global.gpu.release" in line or "griddepcontrol.wait" in line]
            at = next(i for i, what in enumerate(order) if what in ("poll", "wait"))
            print(f"{place:10s} poll {poll:2d}: registers {registers(ptx)} (library's "
                  f"{own}), 16-byte weight loads {order[:at].count('w')} before its "
                  f"{order[at]}, {order[at:].count('w')} after; counts in last: "
                  f"{order[-1] == 'count'}", flush=True)


if __name__ == "__main__":
    main()
