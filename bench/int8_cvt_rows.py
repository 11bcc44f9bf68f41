"""int8 rows (a scale a row) whose weights become fp32 with integer ops alone, no
integer-to-float conversion instruction.

The library's int8 row kernels (row_parts.py) write ``w.to(tl.float32)`` on an int8
tile: on sm_90 that is one I2F a weight (I2F.S8, or a PRMT sign extension and I2F.S16),
and conversions issue at about 16 a clock a multiprocessor against 64 for integer ops
and 128 for fp32 ones: the ~1.1B's 23 M gate/up weights need ~5.5 us of them on 132
SMs, as long as their bytes take to read. Here the tile is read as int32 words (four
weights each), xor'd once with 0x80808080 (each byte's sign bit: x + 128, unsigned),
and weight k of a word is one byte permute (PTX prmt) under the exponent of 2^23 and
one fp32 subtract:

    float_bits(0x4B0000 << 8 | (x + 128)) - (2^23 + 128) = x      (exact: Sterbenz)

Under the interpreter (no inline PTX) the same bits come from shifts and masks. Byte k of
word j is column 4j + k, so x is read as one row and split into four quarters, x[4j + k]
for each k. The sums are fp32 throughout, as the library's; only their order within a
tile differs.

    python bench/int8_cvt_rows.py [--chain [BASE]]      (without a GPU)

compiles the library's one-block kernel at the ~1.1B int8 chain's q/k/v, gate/up and
head shapes (gemv_config's configurations, and CHANGES' other gate/up shapes), the same
kernel over fp16 rows, and this one, for sm_90a, disassembles each with Triton's bundled
nvdisasm and counts instructions a weight by class. The library's ~8 a weight at
gate/up's 2 rows a program make an issue floor as long as the I2F one, so its other
shapes (more rows sharing each column's x work) are variants too. ``--chain`` prints
decode_chain_cuda.py's ``--int8 --variants`` list of cvt_variants (bench/pending/
int8_cvt_chain.sh).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from targets.aoti.kernels.dependent_launch import launcher  # noqa: E402
from targets.aoti.kernels.row_parts import _block_rows, _finish  # noqa: E402

@triton.jit
def _byte_as_float(words, BYTE: tl.constexpr):
    """Byte BYTE of each int32 word, an int8 weight, as its exact fp32 value."""
    bits = ((words >> (8 * BYTE)) & 0xFF) ^ 0x4B000080
    return bits.to(tl.float32, bitcast=True) - 8388736.0  # 2^23 + 128


@triton.jit
def _x_quarter(x_ptr, nw_ptr, cols, col_ok, OFFSET: tl.constexpr, HAS_NORM: tl.constexpr):
    """(x over ``cols`` in fp32 times the norm's weight, x^2 before it)."""
    x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    squares = x * x
    if HAS_NORM:
        x = x * (tl.load(nw_ptr + cols, mask=col_ok, other=0.0).to(tl.float32) + OFFSET)
    return x, squares


@triton.jit
def _x_quarters(x_ptr, nw_ptr, start, OFFSET: tl.constexpr, K: tl.constexpr,
                WIDTH: tl.constexpr, HAS_NORM: tl.constexpr):
    """x from column ``start`` (times the norm's weight) as four quarters, x[start + 4j +
    k] for k = 0..3, read as one contiguous row and split in registers; x^2 summed."""
    j = tl.arange(0, WIDTH)
    cols = start + 4 * j[:, None] + tl.arange(0, 4)[None, :]
    x, squares = _x_quarter(x_ptr, nw_ptr, cols, cols < K, OFFSET, HAS_NORM)
    low, high = tl.split(tl.reshape(x, (WIDTH, 2, 2)))  # (4j + 2a) and (4j + 2a + 1)
    x0, x2 = tl.split(low)
    x1, x3 = tl.split(high)
    return x0, x1, x2, x3, tl.sum(squares, axis=1)


@triton.jit
def _bytes_as_floats(words, PRMT: tl.constexpr):
    """The four int8 weights of each int32 word as exact fp32 values, byte 0 first.
    PRMT: each in one byte permute (PTX prmt, on the GPU) after one xor a word, else
    (the interpreter) in shifts and masks; both give the same bits."""
    if PRMT:
        flipped = words ^ -2139062144  # 0x80808080 as an int32: each byte's sign bit
        b0, b1, b2, b3 = tl.inline_asm_elementwise(
            "{ .reg .b32 hi; mov.b32 hi, 0x4B000000;"
            " prmt.b32 $0, $4, hi, 0x7650; prmt.b32 $1, $4, hi, 0x7651;"
            " prmt.b32 $2, $4, hi, 0x7652; prmt.b32 $3, $4, hi, 0x7653; }",
            "=r,=r,=r,=r,r", [flipped], dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
            is_pure=True, pack=1)
        return (b0.to(tl.float32, bitcast=True) - 8388736.0,
                b1.to(tl.float32, bitcast=True) - 8388736.0,
                b2.to(tl.float32, bitcast=True) - 8388736.0,
                b3.to(tl.float32, bitcast=True) - 8388736.0)
    return (_byte_as_float(words, 0), _byte_as_float(words, 1), _byte_as_float(words, 2),
            _byte_as_float(words, 3))


@triton.jit
def _word_sums(words, up_words, acc, up, squares, x_ptr, nw_ptr, start, OFFSET: tl.constexpr,
               K: tl.constexpr, WIDTH: tl.constexpr, HAS_NORM: tl.constexpr,
               ACT: tl.constexpr, PRMT: tl.constexpr):
    """acc (and up) plus a tile of WIDTH words a row against x from column ``start``:
    byte k of word j against x[start + 4j + k]; squares plus x^2 over the tile."""
    x0, x1, x2, x3, sq = _x_quarters(x_ptr, nw_ptr, start, OFFSET, K, WIDTH, HAS_NORM)
    squares += sq
    w0, w1, w2, w3 = _bytes_as_floats(words, PRMT)
    acc += w0 * x0[None, :]
    acc += w1 * x1[None, :]
    acc += w2 * x2[None, :]
    acc += w3 * x3[None, :]
    if ACT != 0:
        u0, u1, u2, u3 = _bytes_as_floats(up_words, PRMT)
        up += u0 * x0[None, :]
        up += u1 * x1[None, :]
        up += u2 * x2[None, :]
        up += u3 * x3[None, :]
    return acc, up, squares


@triton.jit
def _word_tile(w_ptr, rows, row_ok, start, N: tl.constexpr, K: tl.constexpr,
               WIDTH: tl.constexpr, ACT: tl.constexpr):
    """The rows' WIDTH words from column ``start`` (and the up rows' N below)."""
    j = tl.arange(0, WIDTH)
    at = rows[:, None] * (K // 4) + start // 4 + j[None, :]
    ok = row_ok[:, None] & (start // 4 + j < K // 4)[None, :]  # K: a multiple of 4
    words = tl.load(w_ptr + at, mask=ok, other=0, eviction_policy="evict_first")
    if ACT != 0:
        up_words = tl.load(w_ptr + N * (K // 4) + at, mask=ok, other=0,
                           eviction_policy="evict_first")
    else:
        up_words = words
    return words, up_words


@triton.jit
def _cvt_rows(x_ptr, w_ptr, s_ptr, nw_ptr, r_ptr, out_ptr, EPS: tl.constexpr,
              OFFSET: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
              HAS_NORM: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD: tl.constexpr,
              GDC: tl.constexpr, PRMT: tl.constexpr):
    rows = _block_rows(tl.program_id(0), BLOCK_N, 0, 0)
    row_ok = rows < N
    if GDC:  # the next kernel may start as soon as every program here has
        tl.extra.cuda.gdc_launch_dependents()
    if AHEAD > 0:  # no kernel of the step writes weights: loaded before the wait
        first, up_first = _word_tile(w_ptr, rows, row_ok, 0, N, K, AHEAD // 4, ACT)
    if GDC:
        tl.extra.cuda.gdc_wait()
    y = tl.zeros((BLOCK_N,), dtype=tl.float32)
    u = tl.zeros((BLOCK_N,), dtype=tl.float32)
    square_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if AHEAD > 0:
        acc0 = tl.zeros((BLOCK_N, AHEAD // 4), dtype=tl.float32)
        acc0, up0, sq0 = _word_sums(first, up_first, acc0, acc0, tl.zeros(
            (AHEAD // 4,), dtype=tl.float32), x_ptr, nw_ptr, 0, OFFSET, K, AHEAD // 4,
            HAS_NORM, ACT, PRMT)
        y += tl.sum(acc0, axis=1)
        u += tl.sum(up0, axis=1)
        square_sum += tl.sum(sq0, axis=0)
    acc = tl.zeros((BLOCK_N, BLOCK_K // 4), dtype=tl.float32)
    up = tl.zeros((BLOCK_N, BLOCK_K // 4), dtype=tl.float32)
    squares = tl.zeros((BLOCK_K // 4,), dtype=tl.float32)
    for start in tl.static_range(AHEAD, K, BLOCK_K):
        words, up_words = _word_tile(w_ptr, rows, row_ok, start, N, K, BLOCK_K // 4, ACT)
        acc, up, squares = _word_sums(words, up_words, acc, up, squares, x_ptr, nw_ptr,
                                      start, OFFSET, K, BLOCK_K // 4, HAS_NORM, ACT, PRMT)
    y = _finish(y + tl.sum(acc, axis=1), u, up, square_sum + tl.sum(squares, axis=0),
                s_ptr, r_ptr, s_ptr, s_ptr, s_ptr, rows, row_ok, EPS, N, K, False,
                HAS_NORM, ACT, HAS_RES, True, BLOCK_N, 0, 0)
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def cvt_rows_kernel(x_ptr, w_ptr, s_ptr, nw_ptr, r_ptr, out_ptr, EPS: tl.constexpr,
                    OFFSET: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                    HAS_NORM: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD: tl.constexpr,
                    PRMT: tl.constexpr = True):
    """reference.row_gemv (no bias) over int8 rows read as int32 words, a plain launch."""
    _cvt_rows(x_ptr, w_ptr, s_ptr, nw_ptr, r_ptr, out_ptr, EPS, OFFSET, N, K, HAS_NORM,
              ACT, HAS_RES, BLOCK_N, BLOCK_K, AHEAD, False, PRMT)


@triton.jit
def cvt_rows_kernel_gdc(x_ptr, w_ptr, s_ptr, nw_ptr, r_ptr, out_ptr, EPS: tl.constexpr,
                        OFFSET: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                        HAS_NORM: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        AHEAD: tl.constexpr, PRMT: tl.constexpr = True):
    """The same as a programmatic dependent launch: the first AHEAD columns' words
    before the wait."""
    _cvt_rows(x_ptr, w_ptr, s_ptr, nw_ptr, r_ptr, out_ptr, EPS, OFFSET, N, K, HAS_NORM,
              ACT, HAS_RES, BLOCK_N, BLOCK_K, AHEAD, True, PRMT)


def launch_cvt_rows(x, weight, weight_scale, norm_weight, residual, act: int,
                    config: tuple, pdl: bool = False, eps: float = 1e-5,
                    offset: float = 0.0) -> torch.Tensor:
    """reference.row_gemv(x, weight, None, norm_weight, residual, eps, offset, act,
    weight_scale) over int8 rows ``weight`` (K a multiple of 4); ``config`` (BLOCK_N,
    BLOCK_K, warps, AHEAD), gemv_config's one-block form (AHEAD 0 or at least 16)."""
    rows, cols = weight.shape
    block_n, block_k, warps, ahead = config[:4]
    if weight.dtype != torch.int8 or cols % 4 or weight_scale is None:
        raise ValueError("int8 rows of a multiple of 4 columns, with their scales")
    if ahead and (ahead < 16 or ahead & (ahead - 1)) or block_k < 16:
        raise ValueError(f"config {config}: AHEAD 0 or a power of two >= 16, BLOCK_K >= 16")
    width = rows // 2 if act else rows
    out = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)
    launch, _ = launcher(cvt_rows_kernel, cvt_rows_kernel_gdc, x.device, pdl)
    dummy = weight_scale  # an unused pointer argument (its branch is compiled out)
    launch((triton.cdiv(width, block_n),))(
        x.reshape(cols), weight.contiguous().view(torch.int32),
        weight_scale.reshape(-1), dummy if norm_weight is None else norm_weight,
        dummy if residual is None else residual.reshape(width).contiguous(), out,
        EPS=eps, OFFSET=offset, N=width, K=cols, HAS_NORM=norm_weight is not None,
        ACT=act, HAS_RES=residual is not None, BLOCK_N=block_n, BLOCK_K=block_k,
        AHEAD=ahead, PRMT=os.environ.get("TRITON_INTERPRET") != "1", num_warps=warps)
    return out


class CvtLaunch:
    """A chain configuration that is a launch of its own (decode_chain_cuda.step's
    ``configs[name](x, rows, scale, fold, pdl)``): launch_cvt_rows with ``config``."""

    def __init__(self, config: tuple):
        self.config = config

    def __call__(self, x, weight, scale, fold: dict, pdl: bool):
        return launch_cvt_rows(x, weight, scale, fold.get("norm"), fold.get("residual"),
                               fold.get("act", 0), self.config, pdl)

    def __repr__(self) -> str:  # the row's "configs" in the bench's JSON
        return f"i2f-free{self.config}"


# name -> {product: its configuration}: "i2f-free" ones on this kernel (None: the base's
# own configuration, so the conversion is all that changes), "library" ones the library's
# one-block kernel in the same configuration (what more rows a program change without it).
# More rows share each column's x work (the norm, the move into the tile's layout): the
# library's gate/up runs 8.0 instructions a weight at 2 rows, 6.4 at 4 (python
# bench/int8_cvt_rows.py), so its one I2F a weight becomes the binding floor.
CHANGES = {
    "nothing changed": {},  # the base again: the spread between two equal graphs
    "i2f-free gate/up": {"gate_up": None},
    "i2f-free q/k/v": {"qkv": None},
    "i2f-free head": {"head": None},
    "i2f-free gate/up + q/k/v + head": {"gate_up": None, "qkv": None, "head": None},
    "i2f-free gate/up 4 rows": {"gate_up": (4, 1024, 4, 0)},
    "library gate/up 4 rows": {"gate_up": (4, 1024, 4, 0)},
    "i2f-free gate/up 8 rows 512-column tiles": {"gate_up": (8, 512, 4, 0)},
    "library gate/up 8 rows 512-column tiles": {"gate_up": (8, 512, 4, 0)},
    "i2f-free gate/up 4 rows + q/k/v + head": {"gate_up": (4, 1024, 4, 0), "qkv": None,
                                               "head": None},
}


def _changed(configs: dict, name: str, product: str, config):
    config = config or configs[product][:4]
    return CvtLaunch(config) if name.startswith("i2f-free") else config


def cvt_variants(bases: dict) -> dict:
    """decode_chain_cuda.variants()'s ``--int8`` entries: each base (name -> its variant
    tuple) with CHANGES' products changed."""
    return {f"{base} + {name}": (pdl, {**configs, **{
        product: _changed(configs, name, product, config)
        for product, config in changes.items()}}, *rest)
        for base, (pdl, configs, *rest) in bases.items() for name, changes in CHANGES.items()}


# the base a library runs now: the layer's attention and o in one launch
BASE = "dependent + join + attention-o joined 8 splits 4 rows"


def chain_names(base: str = BASE) -> list[str]:
    """A ``--variants`` list: ``base``, then it with each change, "nothing changed" (the
    base's graph again: the spread between two equal graphs) last."""
    names = [name for name in CHANGES if name != "nothing changed"] + ["nothing changed"]
    return [base] + [f"{base} + {name}" for name in names]


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
    """{library int8, library fp16, i2f-free int8}: each compiled for sm_90a at
    ``product``'s shape in ``config`` (by default the int8 chain's: gemv_config's,
    dependent, 132 SMs), and the weights a thread reduces."""
    from bench.int4_rows_ptx import sm90_compiled
    from targets.aoti.kernels import triton_kernels
    n, k, norm, act, res = SHAPES[product]
    block_n, block_k, warps, ahead = config or triton_kernels.gemv_config(
        n, k, bool(act), True, 1, 132)[:4]
    common = dict(EPS=1e-5, OFFSET=0.0, N=n, K=k, HAS_NORM=norm, ACT=act, HAS_RES=res,
                  BLOCK_N=block_n, BLOCK_K=block_k, AHEAD=ahead)
    library = dict(common, HAS_BIAS=False, HAS_SCALE=True, W_AHEAD=True, TILE_X=False,
                   ROT_ROWS=0, HEAD_D=0)
    found = {f"library {kind}": sm90_compiled(triton_kernels.row_gemv_kernel_gdc,
                                              {"w_ptr": pointer}, library, warps)
             for kind, pointer in (("int8", "*i8"), ("fp16", "*fp16"))}
    found["i2f-free int8"] = sm90_compiled(cvt_rows_kernel_gdc, {"w_ptr": "*i32"},
                                           dict(common, PRMT=True), warps)
    per_thread = block_n * k * (2 if act else 1) / (32 * warps)
    return {"config": (block_n, block_k, warps, ahead), "weights": per_thread, **found}


def _row(name: str, compiled, weights: float) -> str:
    from bench.int4_rows_ptx import ptxas_report
    counts = class_counts(sass(compiled))
    return (f"  {name:14s} registers {ptxas_report(compiled.asm['ptx'])[0]:3d}  " + "  ".join(
        f"{c} {counts.get(c, 0) / weights:.2f}" for c in CLASSES))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chain", nargs="?", const=BASE, metavar="BASE",
                        help="print a --variants list over BASE for decode_chain_cuda.py")
    args = parser.parse_args()
    if args.chain:
        print(",".join(chain_names(args.chain)))
        return
    print(f"triton {triton.__version__}, sm_90a; instructions a weight (whole kernel, "
          f"unrolled) by class: {', '.join(CLASSES)}")
    configs = {(product, config) for changes in CHANGES.values()
               for product, config in changes.items()}
    for product, config in [(p, None) for p in SHAPES] + sorted(
            (p, c) for p, c in configs if c is not None):
        found = kernels_compiled(product, config)
        print(f"{product} {found['config']}: {found['weights']:.0f} weights a thread")
        for name in ("library int8", "library fp16", "i2f-free int8"):
            print(_row(name, found[name], found["weights"]), flush=True)


if __name__ == "__main__":
    main()
