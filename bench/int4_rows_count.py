"""Without a GPU: thread instructions a weight of the ~1.1B's five int4 products, the
library's kernel (targets/aoti/kernels/int4_triton.py, int4_config's) against the bench
form (bench/int4_rows_pairs.py), each the ``_gdc`` form compiled for sm_90a here.

    python bench/int4_rows_count.py [product=(BLOCK_N,BLOCK_G,warps) ...]

Both kernels unroll their loops (static_range), so a program runs each SASS instruction
once: instructions a weight = SASS lines x threads / the program's weights (Nsight
Compute's executed counts of the library's kernel agree within 4%). Also: registers,
local-memory spills (LDL/STL), barriers, programs a multiprocessor holds and waves.
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.decode_chain_int4 import GROUP, SHAPES, resident  # noqa: E402
from bench.int4_rows_ptx import registers, sm90_compiled  # noqa: E402


def sass_ops(kernel) -> list[str]:
    """The cubin's SASS opcodes (predicates and NOPs left out)."""
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "k.cubin").write_bytes(kernel.asm["cubin"])
        sass = subprocess.run([str(cuobjdump), "-sass", f"{tmp}/k.cubin"],
                              capture_output=True, text=True, check=True).stdout
    ops = [line.split() for line in re.findall(r"/\*[0-9a-f]{4}\*/\s+([^;]+);", sass)]
    ops = [words[1] if words[0].startswith("@") else words[0] for words in ops]
    return [op for op in ops if op != "NOP"]


def _values(product: str, block_n: int, block_g: int) -> dict:
    from targets.aoti.kernels.int4_triton import rotary_block
    n, k, norm, act, res, rotated = SHAPES[product]
    return dict(EPS=1e-5, OFFSET=0.0, N=n, K=k, HAS_BIAS=False, HAS_NORM=norm, ACT=act,
                HAS_RES=res, BLOCK_N=rotary_block(block_n, rotated), BLOCK_G=block_g,
                ROT_ROWS=rotated, HEAD_D=64 if rotated else 0)


def library(product: str, config: tuple | None = None) -> tuple:
    """(compiled kernel, values, warps) of the library's kernel."""
    from targets.aoti.kernels.int4_triton import int4_config, int4_row_gemv_kernel_gdc
    n, k, _, act, _, _ = SHAPES[product]
    block_n, block_g, warps, *forms = config or int4_config(n, k, GROUP, bool(act))
    values = {**_values(product, block_n, block_g), "GROUP": GROUP,
              "SPLIT_X": (*forms, bool(act))[0]}
    return sm90_compiled(int4_row_gemv_kernel_gdc, {"w_ptr": "*u8"}, values, warps), values, warps


def pairs(product: str, config: tuple | None = None) -> tuple:
    """(compiled kernel, values, warps) of the bench form (fp16 pairs, rows a thread)."""
    from bench.int4_rows_pairs import int4_pairs_kernel, pairs_config
    n, k = SHAPES[product][:2]
    block_n, block_g, warps = config or pairs_config(n, k)
    values = {**_values(product, block_n, block_g), "GDC": True, "EMULATE": False}
    return sm90_compiled(int4_pairs_kernel, {"w_ptr": "*u8"}, values, warps), values, warps


def report(form: str, product: str, config: tuple | None = None) -> dict:
    kernel, values, warps = (pairs if form == "pairs" else library)(product, config)
    ops = sass_ops(kernel)
    n, k, _, act, _, _ = SHAPES[product]
    weights = values["BLOCK_N"] * k * (2 if act else 1)
    regs = int(registers(kernel.asm["ptx"]))
    kinds = collections.Counter(op.split(".")[0] for op in ops)
    fits = resident(regs, warps, kernel.metadata.shared)
    return {"form": form, "product": product, "config": (values["BLOCK_N"], values["BLOCK_G"],
                                                         warps),
            "per_weight": round(len(ops) * 32 * warps / weights, 2), "sass": len(ops),
            "registers": regs, "shared": kernel.metadata.shared,
            "spills": kinds["LDL"] + kinds["STL"],
            "barriers": kinds["BAR"], "fits": fits,
            "waves": round(triton.cdiv(n, values["BLOCK_N"]) / (fits * 132), 2),
            "top": dict(kinds.most_common(8))}


def main() -> None:
    import ast
    asked = [arg.split("=") for arg in sys.argv[1:]]
    runs = ([(form, product, None) for product in SHAPES for form in ("library", "pairs")]
            if not asked else [("pairs", p, ast.literal_eval(c)) for p, c in asked])
    for form, product, config in runs:
        r = report(form, product, config)
        print(f"{form:8s} {product:8s} {str(r['config']):13s} {r['per_weight']:5.2f} a weight, "
              f"SASS {r['sass']:5d}, registers {r['registers']:3d}, spills {r['spills']:3d}, "
              f"barriers {r['barriers']:3d}, {r['fits']:2d} a multiprocessor, "
              f"{r['waves']:.2f} waves  {r['top']}", flush=True)


if __name__ == "__main__":
    main()
