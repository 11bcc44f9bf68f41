"""One MatMulNBits alone, ONNX Runtime's (MLAS) against the onnx target's own kernels
(targets/onnx/kernels) on the same random weights, in one process, interleaved: the
300M checkpoint's four GEMV shapes at 128 rows (a prefill chunk) and one (decode).

    python -m bench.llm.rows.gemv [--bits 8 4] [--rows 128 1] [--reps 30] [--threads 2] [--batch 1]
        [--old REV]   # also the kernels' sources at git REV, as a third column

Prints each shape's median ms and a layer's sum. ``--threads 1`` times the thread's CPU
time (ORT runs a one-thread session on the caller's thread), which other processes on a
shared machine move far less than wall time; more threads: wall time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

from targets.onnx.card import NBITS_BLOCK
from targets.onnx.kernels import HEADERS, SOURCES, compile_library
from targets.onnx.kernels.rewrite import rewrite

# the 300M's decoder layer (hidden 1024, 16 + 2 * 4 heads of 64, MLP 2816): K, N
SHAPES = {"qkv": (1024, 1536), "o": (1024, 1024), "gate_up": (1024, 5632),
          "down": (2816, 1024)}
OUT = Path(__file__).resolve().parents[3] / "build" / "llm" / "rows"


def model(K: int, N: int, bits: int, block: int, ours: bool) -> bytes:
    """y = x @ W as one MatMulNBits (symmetric, accuracy level 4) of random codes."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(K * N + bits)
    nb, blob = -(-K // block), block * bits // 8
    codes = rng.integers(0, 256, (N, nb, blob), dtype=np.uint8)
    scales = (rng.random(N * nb) * 0.01 + 0.001).astype(np.float32)
    node = helper.make_node("MatMulNBits", ["x", "w", "s"], ["y"], domain="com.microsoft",
                            K=K, N=N, bits=bits, block_size=block, accuracy_level=4)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "s", N])],
        [numpy_helper.from_array(codes, "w"), numpy_helper.from_array(scales, "s")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("com.microsoft", 1)])
    if ours:
        assert rewrite(m) == {"MatMulNBits": 1}
    return m.SerializeToString()


def old_library(rev: str) -> Path:
    """The kernels as they were at ``rev``, compiled from a copy of their sources."""
    src = OUT / f"src-{rev}"
    src.mkdir(parents=True, exist_ok=True)
    for name in (*SOURCES, *HEADERS):
        shown = subprocess.run(["git", "show", f"{rev}:targets/onnx/kernels/{name}"],
                               capture_output=True, check=False)
        (src / name).write_bytes(shown.stdout)  # a file not there yet: empty
    return compile_library(OUT / f"kernels-{rev}.so", src)


def session(blob: bytes, library: Path | None, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if library is not None:
        options.register_custom_ops_library(str(library))
    return ort.InferenceSession(blob, options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bits", type=int, nargs="+", default=[8, 4])
    parser.add_argument("--rows", type=int, nargs="+", default=[128, 1])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2, help="ORT's intra-op threads")
    parser.add_argument("--batch", type=int, default=1,
                        help="runs back to back per sample (a model's ops run so: the "
                             "pool's threads stay awake)")
    parser.add_argument("--old", help="git revision of the kernels for a third column")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    libs = {"mlas": None, "ours": compile_library(OUT / "kernels-gemv.so")}
    if args.old:
        libs[f"ours@{args.old}"] = old_library(args.old)
    print("bits rows shape " + " ".join(f"{k:>12}" for k in libs) + "  ours/mlas speed")
    for bits in args.bits:
        block = NBITS_BLOCK[f"int{bits}-weight"]
        for rows in args.rows:
            sums = dict.fromkeys(libs, 0.0)
            for shape, (K, N) in SHAPES.items():
                runs = {k: session(model(K, N, bits, block, lib is not None), lib,
                                      args.threads)
                        for k, lib in libs.items()}
                x = {"x": np.random.default_rng(rows).standard_normal(
                    (1, rows, K)).astype(np.float32)}
                times: dict[str, list[float]] = {k: [] for k in libs}
                clock = time.thread_time if args.threads == 1 else time.perf_counter
                for rep in range(args.reps + 3):  # interleaved; three warm-ups dropped
                    for k, s in runs.items():
                        t = clock()
                        for _ in range(args.batch):
                            s.run(None, x)
                        if rep >= 3:
                            times[k].append((clock() - t) / args.batch)
                med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
                for k in libs:
                    sums[k] += med[k]
                print(f"{bits:>4} {rows:>4} {shape:>5} "
                      + " ".join(f"{med[k]:>12.3f}" for k in libs)
                      + f"  {med['mlas'] / med['ours']:.3f}", flush=True)
            print(f"{bits:>4} {rows:>4} layer "
                  + " ".join(f"{sums[k]:>12.3f}" for k in libs)
                  + f"  {sums['mlas'] / sums['ours']:.3f}", flush=True)


if __name__ == "__main__":
    main()
