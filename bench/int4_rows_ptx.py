"""Without a GPU: the int4-row kernel (targets/aoti/kernels/int4_triton.py, the ``_gdc``
form) of the ~1.1B's five products compiled for sm_90a, with ptxas's registers and the
PTX's weight loads and barriers in order.

    python bench/int4_rows_ptx.py [--order]

Every pointer is declared 16-byte aligned, as Triton's launcher and Inductor declare an
aligned tensor's: without that Triton loads byte by byte (and holds 126-204 registers
a thread). ``--order`` prints, per product, the PTX line of each 16-byte
weight load, of the wait and of each barrier: a load after a barrier waits for it.
Needs Triton (a scratch ``pip install --target`` does) and its bundled ptxas.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.decode_kernels_cuda import SHAPES  # noqa: E402

ROTATED = {"qkv+norm": (2048 + 256, 64)}  # q's and k's rows (32 + 4 heads of 64)
# the decode attention kernels' int32 strides (targets/aoti/kernels/decode_attention.py)
ATTENTION_STRIDES = ("sq_h", "spk_h", "spk_s", "snk_h", "spv_h", "spv_s", "snv_h")


def sm90_ptx(kernel, pointer_kinds: dict, values: dict, warps: int) -> str:
    """``kernel`` compiled for sm_90a with ``values`` as its constexprs: its PTX. Pointers
    are fp16 unless ``pointer_kinds`` names another type (``{"w_ptr": "*u8"}``); every one
    is declared 16-byte aligned."""
    return sm90_compiled(kernel, pointer_kinds, values, warps).asm["ptx"]


def sm90_compiled(kernel, pointer_kinds: dict, values: dict, warps: int,
                  strides: tuple = (), **options):
    """sm90_ptx's compile: Triton's compiled kernel (``.asm``: ptx, cubin; ``.metadata``:
    shared bytes among others). ``strides``: int32 arguments, each a multiple of 16 as a
    launch specializes a stride of 16 elements or more; ``options``: Triton's (num_stages)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = kernel.arg_names
    signature = {a: pointer_kinds.get(a, "*fp16") for a in names if a.endswith("_ptr")}
    signature.update({a: "i32" for a in strides})
    signature.update({a: "constexpr" for a in values})
    source = ASTSource(kernel, signature,
                       constexprs={(names.index(a),): v for a, v in values.items()},
                       attrs={(names.index(a),): [["tt.divisibility", 16]]
                              for a in signature if signature[a] != "constexpr"})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, **options})


def compiled(name, n, k, norm, act, res):
    from targets.aoti.kernels import int4_triton
    block_n, block_g, warps, split_x = int4_triton.int4_config(n, k, 128, bool(act))
    rotated, head = ROTATED.get(name, (0, 0))
    block_n = int4_triton.rotary_block(block_n, rotated)
    values = dict(EPS=1e-5, OFFSET=0.0, N=n, K=k, GROUP=128, HAS_BIAS=False,
                  HAS_NORM=norm, ACT=act, HAS_RES=res, BLOCK_N=block_n, BLOCK_G=block_g,
                  ROT_ROWS=rotated, HEAD_D=head, SPLIT_X=split_x)
    ptx = sm90_ptx(int4_triton.int4_row_gemv_kernel_gdc, {"w_ptr": "*u8"}, values, warps)
    return (block_n, block_g, warps), ptx


def ptxas_report(ptx: str) -> tuple[int, int]:
    """(registers a thread, bytes spilled) of ``ptx`` by Triton's bundled ptxas for sm_90a
    (-1 registers where it says none)."""
    import triton
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as fh:
        fh.write(ptx)
        fh.flush()
        report = subprocess.run([str(ptxas), "-v", "-arch=sm_90a", fh.name, "-o",
                                 "/dev/null"], capture_output=True, text=True).stderr
    regs = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores", report)
    return int(regs.group(1)) if regs else -1, int(spills.group(1)) if spills else 0


def registers(ptx: str) -> str:
    found = ptxas_report(ptx)[0]
    return str(found) if found >= 0 else "?"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--order", action="store_true")
    args = parser.parse_args()
    for shape in SHAPES:
        config, ptx = compiled(*shape)
        lines = ptx.splitlines()
        marks = [(i, "w" if ".v4." in line and "evict_first" in line else
                  "wait" if "griddepcontrol.wait" in line else "bar")
                 for i, line in enumerate(lines)
                 if ("ld.global" in line and ".v4." in line) or "bar.sync" in line
                 or "griddepcontrol.wait" in line]
        print(f"{shape[0]:20s} {config} registers {registers(ptx)}, 16-byte weight loads "
              f"{sum(m == 'w' for _, m in marks)}, barriers {sum(m == 'bar' for _, m in marks)}")
        if args.order:
            print("   " + " ".join(f"{m}@{i}" for i, m in marks[:24]))


if __name__ == "__main__":
    main()
