"""bench/persistent_mlp_stream.py's kernel (bench/stream_mlp_gluon.py) planned, launched
and compiled offline: the tile plan (each program's tiles of o, gate/up and down, in the
order it takes them), the launch with TMA descriptors made on the host (each weight
[N, K] seen as [N, K / width, width], one box a tile: a tile's rows of 2,048 columns are
more than TMA's 256 a side), and the sm_90a resources of a configuration without a GPU.
Needs Triton 3.6 (Gluon) for the launch and the compile only; the plan is plain Python.
"""

from __future__ import annotations

import torch

# (rows a tile, chunks a tile, chunk width (columns), slots in the ring, warps)
DEFAULT_CONFIG = (8, 8, 256, 6, 8)
SHARED_LIMIT = 232448  # an sm_90 block's most shared memory (227 KB)
SPINS = 1 << 22  # a barrier's reads before it gives up (seconds of spinning)

# name -> configuration, for the chain's variants (decode_chain_persistent.py) and --check
STREAM_CONFIGS = {
    "32K x6 8w": DEFAULT_CONFIG,  # 8 rows x 2,048 columns a tile, 192 KB of ring
    "32K x4 8w": (8, 8, 256, 4, 8),  # fewer tiles ahead: 128 KB
    "16K x12 4w": (4, 8, 256, 12, 4),  # half the tile, as many bytes ahead
    "64K x3 8w": (16, 8, 256, 3, 8),  # 16 rows a tile: gate/up's turns uneven by one
}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def plan(hidden: int, inter: int, programs: int, config: tuple | None = None) -> dict:
    """The tile plan: each product's (rows N, columns K, turns, parts), the ring's and
    x's shared bytes; refuses (ValueError) what the kernel cannot lay out."""
    rows, chunks, width, slots, warps = config or DEFAULT_CONFIG
    columns = chunks * width
    for name, value in (("rows", rows), ("chunks", chunks), ("width", width),
                        ("programs", programs)):
        if value < 1 or value & (value - 1):
            raise ValueError(f"{name} {value}: not a power of two")
    if not 8 <= width <= 256 or rows > 256 or chunks > 256:
        raise ValueError(f"a tile of {rows} x {chunks} x {width}: TMA's box is 256 at most "
                         "a side, and a chunk 16 bytes at least")
    if rows % warps or chunks * (width // 8) < 32:
        raise ValueError(f"{rows} rows, {chunks} chunks of {width}: {warps} warps (a warp "
                         "a row, 32 lanes of 16 bytes along the chunks) do not split them")
    if hidden % width or inter % width:
        raise ValueError(f"widths {hidden} and {inter}: not multiples of the chunk, "
                         f"{width}")
    products = {"o": (hidden, hidden), "gate_up": (2 * inter, hidden),
                "down": (hidden, inter)}
    found = {"programs": programs, "config": (rows, chunks, width, slots, warps),
             "tile_bytes": rows * columns * 2}
    for name, (n, k) in products.items():
        found[name] = (n, k, _cdiv(_cdiv(n, rows), programs), _cdiv(k, columns))
    xparts = max(found[name][3] for name in products)
    found["shared_bytes"] = slots * found["tile_bytes"] + xparts * columns * 4 + slots * 8
    found["xparts"] = xparts
    if found["shared_bytes"] > SHARED_LIMIT:
        raise ValueError(f"{found['shared_bytes']} bytes of shared memory: more than "
                         f"{SHARED_LIMIT}")
    return found


def tiles(found: dict, pid: int) -> list:
    """Program ``pid``'s tiles in the order it takes them: (product, first row, first
    column), the kernel's mapping (stream_mlp_gluon._copy) in Python."""
    rows, chunks, width = found["config"][:3]
    listed = []
    for name in ("o", "gate_up", "down"):
        n, k, turns, parts = found[name]
        for local in range(turns * parts):
            block = pid + (local // parts) * found["programs"]
            listed.append((name, block * rows, (local % parts) * chunks * width))
    return listed


def real_bytes(found: dict, tile: tuple) -> int:
    """The weight bytes a tile reads (the copy engine fills zeros past the edges)."""
    name, row, column = tile
    n, k = found[name][:2]
    rows, chunks, width = found["config"][:3]
    return max(0, min(rows, n - row)) * max(0, min(chunks * width, k - column)) * 2


def _constants(found: dict, eps: float, stamps: bool, gdc: bool, hidden: int,
               inter: int) -> dict:
    rows, chunks, width, slots, warps = found["config"]
    return dict(EPS=eps, HIDDEN=hidden, INTER=inter, PROGRAMS=found["programs"],
                ROWS=rows, CHUNKS=chunks, WIDTH=width, LANES=width // 8, SLOTS=slots,
                XPARTS=found["xparts"], TURNS_O=found["o"][2], PARTS_O=found["o"][3],
                TURNS_G=found["gate_up"][2], PARTS_G=found["gate_up"][3],
                TURNS_D=found["down"][2], PARTS_D=found["down"][3], SPINS=SPINS,
                STAMPS=stamps, GDC=gdc)


def _tile_layout():
    from triton.experimental.gluon import language as gl
    # no swizzle: a chunk's 512 bytes sit in a row, read 16 bytes a lane without conflicts
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=3)


def launch_stream_mlp(attn, hidden, o_weight, norm_weight, gate_up_weight, down_weight,
                      sync, eps: float, pdl: bool = False, config: tuple | None = None,
                      programs: int | None = None, stamps: torch.Tensor | None = None):
    """(o, out) as bench/persistent_mlp.launch_persistent_mlp returns them (SiLU, no norm
    offset). ``sync``: int32 zeros, two (the barrier's count, left a multiple of the grid;
    a flag set where a barrier gave up); ``config``: DEFAULT_CONFIG's layout; ``programs``:
    the grid (a power of two, one a multiprocessor by default); ``stamps``: int64, 8 a
    program, the GPU clock at each stage's end."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from bench.persistent_mlp import persistent_grid
    from bench.stream_mlp_gluon import stream_mlp_kernel
    width_o, inter = o_weight.shape[0], down_weight.shape[1]
    found = plan(width_o, inter, programs or persistent_grid(attn.device, 1), config)
    rows, chunks, width, slots, warps = found["config"]
    layout = _tile_layout()

    def described(w):  # [N, K] as [N, K / width, width]: one box a tile
        n, k = w.shape
        return TensorDescriptor(w, [n, k // width, width], [k, width, 1],
                                [rows, chunks, width], layout)
    o = torch.empty((*hidden.shape[:-1], width_o), dtype=hidden.dtype, device=hidden.device)
    raw = torch.empty(2 * inter, dtype=torch.float32, device=hidden.device)
    out = torch.empty_like(o)
    constants = _constants(found, eps, stamps is not None, pdl, width_o, inter)
    stream_mlp_kernel[(found["programs"],)](
        described(o_weight.contiguous()), described(gate_up_weight.contiguous()),
        described(down_weight.contiguous()), attn.reshape(-1).contiguous(),
        hidden.reshape(-1).contiguous(), norm_weight, o, raw, out, sync,
        sync if stamps is None else stamps, **constants, num_warps=warps, launch_pdl=pdl)
    return o, out


def resources(config: tuple | None = None, hidden: int = 2048, inter: int = 5632,
              programs: int = 128) -> dict:
    """The dependent form compiled for sm_90a without a GPU: ptxas's registers and spilled
    bytes, and Triton's shared bytes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from bench.int4_rows_ptx import ptxas_report
    from bench.stream_mlp_gluon import stream_mlp_kernel
    found = plan(hidden, inter, programs, config)
    rows, chunks, width, slots, warps = found["config"]
    box = f"tensordesc<fp16[{rows}, {chunks}, {width}],{_tile_layout()!r}>"
    kinds = {"gu_ptr": "*fp32", "sync_ptr": "*i32", "stamps_ptr": "*i64"}
    names = stream_mlp_kernel.arg_names
    signature = {a: box for a in names if a.endswith("_desc")}
    signature.update({a: kinds.get(a, "*fp16") for a in names if a.endswith("_ptr")})
    values = _constants(found, 1e-5, False, True, hidden, inter)
    signature.update({a: "constexpr" for a in values})
    source = GluonASTSource(stream_mlp_kernel, signature,
                            constexprs={(names.index(a),): v for a, v in values.items()},
                            attrs={(names.index(a),): [["tt.divisibility", 16]]
                                   for a in signature if signature[a].startswith("*")})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps})
    registers, spilled = ptxas_report(compiled.asm["ptx"])
    return {"registers": registers, "spilled_bytes": spilled,
            "shared_bytes": compiled.metadata.shared, "planned_shared_bytes":
            found["shared_bytes"], "tiles_a_program": len(tiles(found, 0))}
