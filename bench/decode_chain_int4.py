"""decode_chain_cuda.py's ``--int4`` chain: the products over int4 rows
(targets/aoti/kernels/int4_triton.py), launched as a 1.1B int4 build launches them:
int4_config's configuration, q/k/v with its RMSNorm and the rotary embedding of q's and
k's rows folded in (decode_rotary.py's fold), gate/up with its norm and SiLU x up, o and
down with their residuals, the head with the final norm; the attention as in the fp16
chain. Every product is an ``Int4Launch`` (a chain configuration that is a launch of its
own), so a variant changes a product's (BLOCK_N, BLOCK_G, warps[, SPLIT_X]):

    python bench/decode_chain_cuda.py --int4 --rounds 20 --variants "int4 dependent +
        join,int4 dependent + join + gate/up 8 warps,..."     (on the GPU machine)

Two variants take the chain apart rather than speed it up: "null products" runs, in
place of each product, a kernel of the same grid that only waits for the kernel before
and writes its output (what the dependent launches cost with no work), and "weights
from L2" gives every layer the first layer's weights, which then stay in L2 (what the
products cost with no DRAM time). Without a GPU, ``python bench/decode_chain_int4.py``
compiles each variant's ``_gdc`` kernels for sm_90a here (Triton's ptxas and cuobjdump)
and prints registers, shared memory, SASS instructions and barriers, the programs a
multiprocessor holds and the grid's waves on 132 of them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GROUP = 128
# the ~1.1B's products: (rows a program computes, columns, norm, gated, residual,
# rotated rows: q's and k's)
SHAPES = {"qkv": (2560, 2048, True, 0, False, 2304), "o": (2048, 2048, False, 0, True, 0),
          "gate_up": (5632, 2048, True, 1, False, 0), "down": (2048, 5632, False, 0, True, 0),
          "head": (32000, 2048, True, 0, False, 0)}
POSITION = 9  # the rotary embedding's angle: any position will do


def rotary_tables(dim: int, device) -> tuple:
    """(cos, sin) [1, 1, 1, dim] of one position, as the step's rotary embedding gives
    them."""
    angle = POSITION / 10000 ** (torch.arange(0, dim, 2, device=device) / dim)
    return tuple(f(torch.cat([angle, angle])).half().view(1, 1, 1, dim)
                 for f in (torch.cos, torch.sin))


class Int4Launch:
    """A product over int4 rows: launch_int4_row_gemv with ``config`` (None:
    int4_config's, what a build runs) and, for q/k/v, ``rotary`` (cos, sin, rows,
    head dim). ``shared``: every call reads the first call's weights (L2 holds them)."""

    def __init__(self, config: tuple | None = None, rotary: tuple = (),
                 shared: bool = False):
        self.config, self.rotary, self.shared, self.first = config, rotary, shared, None

    def __call__(self, x, packed, scales, fold: dict, pdl: bool) -> torch.Tensor:
        from targets.aoti.kernels.int4_triton import launch_int4_row_gemv
        if self.shared:
            self.first = self.first or (packed, scales)
            packed, scales = self.first
        cos, sin, rows, dim = self.rotary or (None, None, 0, 0)
        return launch_int4_row_gemv(x, packed, scales, None, fold.get("norm"),
                                    fold.get("residual"), 1e-5, 0.0, fold.get("act", 0),
                                    self.config, pdl, cos, sin, rows, dim)

    def __repr__(self) -> str:  # the row's "configs" in the bench's JSON
        return f"int4{self.config or ''}{' shared' if self.shared else ''}"


class PairsLaunch(Int4Launch):
    """A product over the same int4 rows in fp16 pairs, rows a thread
    (bench/int4_rows_pairs.py): ``config`` (BLOCK_N, BLOCK_G, warps), None for
    pairs_config's."""

    def __call__(self, x, packed, scales, fold: dict, pdl: bool) -> torch.Tensor:
        from bench.int4_rows_pairs import launch_int4_pairs
        cos, sin, rows, dim = self.rotary or (None, None, 0, 0)
        return launch_int4_pairs(x, packed, scales, None, fold.get("norm"),
                                 fold.get("residual"), 1e-5, 0.0, fold.get("act", 0),
                                 self.config, pdl, cos, sin, rows, dim)

    def __repr__(self) -> str:
        return f"int4 pairs{self.config or ''}"


@triton.jit
def _null_kernel(x_ptr, out_ptr, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                 GDC: tl.constexpr):
    """A product's grid with no work: wait for the kernel before, write x's first rows."""
    if GDC:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + rows % K)
    tl.store(out_ptr + rows, x, mask=rows < N)


class NullLaunch:
    """In a product's place: _null_kernel over its grid (int4_config's BLOCK_N and
    warps), its output's shape and dtype."""

    def __call__(self, x, packed, scales, fold: dict, pdl: bool) -> torch.Tensor:
        from targets.aoti.kernels.int4_triton import int4_config
        cols = x.shape[-1]
        width = packed.shape[0] // 2 if fold.get("act") else packed.shape[0]
        block_n, _, warps, *_ = int4_config(width, cols, GROUP, bool(fold.get("act")))
        out = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)
        _null_kernel[(triton.cdiv(width, block_n),)](
            x.reshape(cols), out, N=width, K=cols, BLOCK_N=block_n, GDC=pdl,
            num_warps=warps, launch_pdl=pdl)
        return out

    def __repr__(self) -> str:
        return "null"


def int4_weights(made: dict) -> dict:
    """decode_chain_cuda.weights()' chain ``made`` with every product's rows as int4 rows
    (packed, (scale, offset) pairs), packed from its random fp16 weights."""
    from targets.aoti.kernels import int4_rows
    for layer in made["layers"]:
        for name in ("qkv", "o", "gate_up", "down"):
            layer[name] = int4_rows.pack(layer[name][0], GROUP)
    made["head"] = int4_rows.pack(made["head"][0], GROUP)
    return made


def launches(changes: dict, rotary: tuple, shared: bool = False) -> dict:
    """Each product's Int4Launch: int4_config's unless ``changes`` names its
    configuration (a NullLaunch is taken as it is, a PairsLaunch given q/k/v's rotary)."""
    def launch(name, change):
        turned = rotary if name == "qkv" else ()
        if isinstance(change, NullLaunch):
            return change
        if isinstance(change, PairsLaunch):
            return PairsLaunch(change.config, turned, shared)
        return Int4Launch(change, turned, shared)
    return {name: launch(name, changes.get(name)) for name in SHAPES}


# name -> {product: configuration}; products not named keep int4_config's. int4_config
# now: q/k/v, o, gate/up (4, 8, 4) (640, 512, 1,408 programs), down (4, 16, 8) (512),
# the head (8, 4, 4) (4,000). gate/up's gate and up summed in one pass over x (x loaded
# and normalised once) was a kernel flag and lost (1.002-1.004 of the chain): ptxas
# already shares x's loads between the two passes (SASS 864 -> 856)
CHANGES = {
    "nothing changed": {},
    "gate/up 8 warps": {"gate_up": (4, 16, 8, True)},
    "gate/up 8 rows 8 warps": {"gate_up": (8, 8, 8, True)},
    "gate/up 2 rows": {"gate_up": (2, 16, 4, True)},
    "down 4 rows 32 groups": {"down": (4, 32, 8, False)},
    "down 2 rows 4 warps": {"down": (2, 16, 4, False)},
    "down 8 rows 8 groups": {"down": (8, 8, 8, False)},
    "o 2 rows 16 groups": {"o": (2, 16, 4, False)},
    "o 4 rows 8 warps": {"o": (4, 16, 8, False)},
    "o 8 rows 8 warps": {"o": (8, 8, 8, False)},
    "q/k/v 2 rows 16 groups": {"qkv": (2, 16, 4, False)},
    "q/k/v 8 rows 8 warps": {"qkv": (8, 8, 8, False)},
    "head 8 rows 8 warps": {"head": (8, 8, 8, False)},
    "head 16 rows 8 warps": {"head": (16, 4, 8, False)},
}
# fp16 pairs, rows a thread (bench/int4_rows_pairs.py): every product, then one at a time
# (8 rows a program and thread, 2 warps, unless named)
CHANGES.update({
    "pairs": {name: PairsLaunch() for name in SHAPES},
    "pairs 16 rows": {name: PairsLaunch((16, 16, 2)) for name in SHAPES},
    "pairs 4 rows": {name: PairsLaunch((4, 16, 2)) for name in SHAPES},
    # 4 rows where 8 leave a multiprocessor 4-5 warps (q/k/v, o, down), 8 elsewhere
    "pairs mixed rows": {name: PairsLaunch((4, 16, 2) if name in ("qkv", "o", "down")
                                           else None) for name in SHAPES},
    "q/k/v pairs": {"qkv": PairsLaunch()},
    "o pairs": {"o": PairsLaunch()},
    "gate/up pairs": {"gate_up": PairsLaunch()},
    "down pairs": {"down": PairsLaunch()},
    "head pairs": {"head": PairsLaunch()},
})


def int4_variants() -> dict:
    """decode_chain_cuda.variants()'s ``--int4`` entries (the attention as in "dependent +
    join" throughout)."""
    rotary = (*rotary_tables(64, "cuda"), 2304, 64)
    built = launches({}, rotary)
    found = {"int4 plain + join": (False, built, None, True),
             "int4 dependent + join": (True, built, None, True),
             "int4 dependent + join + weights from L2": (True, launches({}, rotary, True),
                                                        None, True),
             "int4 dependent + join + null products": (
                 True, launches({name: NullLaunch() for name in SHAPES}, rotary), None,
                 True)}
    for name, changes in CHANGES.items():
        found[f"int4 dependent + join + {name}"] = (True, launches(changes, rotary), None,
                                                    True)
    return found


def compiled(product: str, config: tuple | None) -> dict:
    """The ``_gdc`` kernel ``config`` launches for ``product``, compiled for sm_90a here:
    registers, shared bytes, SASS instructions and barriers."""
    import re
    import subprocess
    import tempfile

    from bench.int4_rows_ptx import registers, sm90_compiled
    from targets.aoti.kernels.int4_triton import (int4_config, int4_row_gemv_kernel_gdc,
                                                  rotary_block)
    n, k, norm, act, res, rotated = SHAPES[product]
    block_n, block_g, warps, *forms = config or int4_config(n, k, GROUP, bool(act))
    split_x = (*forms, False)[0]
    values = dict(EPS=1e-5, OFFSET=0.0, N=n, K=k, GROUP=GROUP, HAS_BIAS=False,
                  HAS_NORM=norm, ACT=act, HAS_RES=res,
                  BLOCK_N=rotary_block(block_n, rotated), BLOCK_G=block_g,
                  ROT_ROWS=rotated, HEAD_D=64 if rotated else 0, SPLIT_X=split_x)
    kernel = sm90_compiled(int4_row_gemv_kernel_gdc, {"w_ptr": "*u8"}, values, warps)
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "k.cubin").write_bytes(kernel.asm["cubin"])
        sass = subprocess.run([str(cuobjdump), "-sass", f"{tmp}/k.cubin"],
                              capture_output=True, text=True, check=True).stdout
    lines = re.findall(r"/\*[0-9a-f]{4}\*/\s+([^;]+);", sass)
    return {"registers": int(registers(kernel.asm["ptx"])), "warps": warps,
            "shared": kernel.metadata.shared, "sass": len(lines),
            "barriers": sum("BAR.SYNC" in op for op in lines),
            "grid": triton.cdiv(n, block_n)}


def resident(registers: int, warps: int, shared: int) -> int:
    """Programs a Hopper multiprocessor holds by registers (64K, a warp's allocated 256
    at a time), warps (64), programs (32) and shared memory (228 KB, 1 KB a program
    reserved)."""
    per_warp = -(-registers * 32 // 256) * 256
    by_shared = 233472 // (shared + 1024) if shared else 32
    return min(32, 64 // warps, 65536 // (per_warp * warps), by_shared)


def main() -> None:
    checked = [("(int4_config's)", {})] + list(CHANGES.items())
    for name, changes in checked:
        for product in changes or SHAPES:
            change = changes.get(product)
            if isinstance(change, PairsLaunch):  # its own kernel (it imports this module)
                print(f"{name:30s} {product:8s} python bench/int4_rows_count.py counts it")
                continue
            found = compiled(product, change)
            fits = resident(found["registers"], found["warps"], found["shared"])
            print(f"{name:30s} {product:8s} {str(changes.get(product, 'default')):22s} "
                  f"registers {found['registers']:3d}, shared {found['shared']:5d}, SASS "
                  f"{found['sass']:5d}, barriers {found['barriers']:2d}, {fits:2d} a "
                  f"multiprocessor, grid {found['grid']:5d} = "
                  f"{found['grid'] / (fits * 132):.2f} waves", flush=True)


if __name__ == "__main__":
    main()
