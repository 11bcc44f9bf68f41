"""The instructions a weight of the library's int8 row kernels, by class, from their
SASS for sm_90a (no GPU needed): the one-block kernel's int8 tile converted by
``w.to(tl.float32)`` (one I2F a weight on sm_90), the same kernel over fp16 rows, and
int8_words_triton.py's, which reads the int8 rows as int32 words and makes each weight
fp32 with one byte permute and one fp32 subtract (the form the library runs for int8
rows in the one-block shape).

    python bench/int8_cvt_rows.py

compiles the three at the ~1.1B int8 chain's q/k/v, gate/up and head shapes (gemv_config's
configurations, and gate/up's other row counts), disassembles each with Triton's bundled
nvdisasm and counts instructions a weight by class.
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

# the ~1.1B int8 chain's one-block products: (rows out, columns, norm, gated, residual)
SHAPES = {"qkv": (2560, 2048, True, 0, False), "gate_up": (5632, 2048, True, 1, False),
          "head": (32000, 2048, True, 0, False)}
CLASSES = {"I2F": r"I2F", "I2I/PRMT": r"I2I|PRMT", "HADD2.F32": r"HADD2\.F32",
           "FFMA": r"FFMA", "FADD": r"FADD", "FMUL": r"FMUL", "LOP3/SHF": r"LOP3|SHF",
           "LDG": r"LDG", "LDS": r"LDS", "all": r""}


def sass(compiled) -> str:
    """The SASS of a compiled kernel, by Triton's bundled nvdisasm."""
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(compiled.asm["cubin"])
        fh.flush()
        return subprocess.run([str(nvdisasm), "-c", fh.name], capture_output=True,
                              text=True, check=True).stdout


def class_counts(text: str) -> dict:
    """Instructions of each of CLASSES in SASS ``text`` (a predicate aside)."""
    ops = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text,
                     re.M)
    found = collections.Counter()
    for op in ops:
        for name, pattern in CLASSES.items():
            if re.match(pattern, op):
                found[name] += 1
    return dict(found)


def kernels_compiled(product: str, config: tuple | None = None) -> dict:
    """{I2F int8, fp16, words int8, dot4 int8 (x's codes in blocks of 32)}: each compiled for sm_90a at
    ``product``'s shape in ``config`` (by default the int8 chain's: gemv_config's,
    dependent, 132 SMs), and the weights a thread reduces."""
    from bench.int4_rows_ptx import sm90_compiled
    from targets.aoti.kernels import triton_kernels
    from targets.aoti.kernels.int8_words_triton import int8_words_kernel_gdc
    n, k, norm, act, res = SHAPES[product]
    block_n, block_k, warps, ahead = config or triton_kernels.gemv_config(
        n, k, bool(act), True, 1, 132)[:4]
    common = dict(EPS=1e-5, OFFSET=0.0, N=n, K=k, HAS_NORM=norm, ACT=act, HAS_RES=res,
                  BLOCK_N=block_n, BLOCK_K=block_k, AHEAD=ahead)
    library = dict(common, HAS_BIAS=False, HAS_SCALE=True, W_AHEAD=True, TILE_X=False,
                   ROT_ROWS=0, HEAD_D=0)
    found = {kind: sm90_compiled(triton_kernels.row_gemv_kernel_gdc,
                                              {"w_ptr": pointer}, library, warps)
             for kind, pointer in (("I2F int8", "*i8"), ("fp16", "*fp16"))}
    words = dict(common, HAS_BIAS=False, W_AHEAD=True, ROT_ROWS=0, HEAD_D=0, PRMT=True)
    found["words int8"] = sm90_compiled(int8_words_kernel_gdc, {"w_ptr": "*i8"},
                                        dict(words, QBLOCK=0), warps)
    found["dot4 int8"] = sm90_compiled(int8_words_kernel_gdc, {"w_ptr": "*i8"},
                                       dict(words, QBLOCK=32), warps)
    per_thread = block_n * k * (2 if act else 1) / (32 * warps)
    return {"config": (block_n, block_k, warps, ahead), "weights": per_thread, **found}


def _row(name: str, compiled, weights: float) -> str:
    from bench.int4_rows_ptx import ptxas_report
    counts = class_counts(sass(compiled))
    return (f"  {name:14s} registers {ptxas_report(compiled.asm['ptx'])[0]:3d}  " + "  ".join(
        f"{c} {counts.get(c, 0) / weights:.2f}" for c in CLASSES))


# gate/up's other shapes: more rows a program share each column's x work
OTHER_SHAPES = [("gate_up", (2, 1024, 4, 0)), ("gate_up", (8, 512, 4, 0))]


def main() -> None:
    print(f"triton {triton.__version__}, sm_90a; instructions a weight (whole kernel, "
          f"unrolled) by class: {', '.join(CLASSES)}")
    for product, config in [(p, None) for p in SHAPES] + OTHER_SHAPES:
        found = kernels_compiled(product, config)
        print(f"{product} {found['config']}: {found['weights']:.0f} weights a thread")
        for name in ("I2F int8", "fp16", "words int8", "dot4 int8"):
            print(_row(name, found[name], found["weights"]), flush=True)


if __name__ == "__main__":
    main()
