"""The onnx target's GEMV kernels (targets/onnx/kernels) by instruction set, alone: the 300M
checkpoint's 80 layer products (one activation row, random codes and scales), on ONNX
Runtime's MatMulNBits (MLAS), on our AVX2 tiles (forced) and on our AVX-512 VNNI tile.

    python -m bench.llm.nbits_isa --threads 2 --rounds 30 [--out FILE.jsonl]

Each variant runs in a process of its own: an idle session's ONNX Runtime threads spin
after a run and slowed the next session's run in the same process. Figures are the median
wall time of one pass over the 80 products (CPU time of the thread at --threads 1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# hidden 1024, GQA 16/4 at head dim 64, intermediate 2816: qkv, o, gate/up, down
LAYER = [(1024, 1536), (1024, 1024), (1024, 5632), (2816, 1024)]
RECIPES = ((8, 256), (4, 128))  # the onnx target's default blocks (targets/onnx/card.py)
VARIANTS = ("mlas", "avx2", "vnni")


def model(bits: int, block: int, ours: bool) -> bytes:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from targets.onnx.kernels.rewrite import rewrite
    rng = np.random.default_rng(0)
    nodes, tables, outputs = [], [], []
    for i, (K, N) in enumerate(LAYER * 20):
        nb, blob = -(-K // block), block * bits // 8
        nodes.append(helper.make_node(
            "MatMulNBits", [f"x{K}", f"w{i}", f"s{i}"], [f"y{i}"], domain="com.microsoft",
            K=K, N=N, bits=bits, block_size=block, accuracy_level=4))
        codes = rng.integers(0, 256, (N, nb, blob), np.uint8)
        scales = (rng.random(N * nb) * 0.01).astype(np.float32)
        tables += [numpy_helper.from_array(codes, f"w{i}"),
                   numpy_helper.from_array(scales, f"s{i}")]
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT,
                                                     [1, 1, N]))
    inputs = [helper.make_tensor_value_info(f"x{K}", TensorProto.FLOAT, [1, 1, K])
              for K in sorted({k for k, _ in LAYER})]
    graph = helper.make_graph(nodes, "g", inputs, outputs, tables)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    built = helper.make_model(graph, opset_imports=opsets)
    if ours:
        rewrite(built)
    return built.SerializeToString()


def one(variant: str, threads: int, rounds: int) -> dict[str, float]:
    """Median ms per pass of each recipe, on ``variant``, in this process."""
    import numpy as np
    import onnxruntime as ort

    from targets.onnx.kernels import ISA_ENV, LIBRARY, compile_library
    if variant == "avx2":
        os.environ[ISA_ENV] = "avx2"
    clock = time.thread_time if threads == 1 else time.perf_counter
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        library = compile_library(Path(tmp) / LIBRARY)
        for bits, block in RECIPES:
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            if variant != "mlas":
                options.register_custom_ops_library(str(library))
            session = ort.InferenceSession(model(bits, block, variant != "mlas"), options)
            feeds = {i.name: np.random.default_rng(1).standard_normal(
                (1, 1, int(i.name[1:]))).astype(np.float32) for i in session.get_inputs()}
            session.run(None, feeds)
            times = []
            for _ in range(rounds):
                start = clock()
                session.run(None, feeds)
                times.append(clock() - start)
            result[f"int{bits} b{block}"] = round(statistics.median(times) * 1e3, 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--only", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help="append the result as one JSON line")
    args = parser.parse_args()
    if args.only:
        print(json.dumps(one(args.only, args.threads, args.rounds)))
        return
    row = {"threads": args.threads, "rounds": args.rounds, "ms": {}}
    for variant in VARIANTS:
        argv = [sys.executable, "-m", __spec__.name, "--only", variant,
                "--threads", str(args.threads), "--rounds", str(args.rounds)]
        done = subprocess.run(argv, check=True, capture_output=True, text=True)
        row["ms"][variant] = json.loads(done.stdout.strip().splitlines()[-1])
        print(variant, row["ms"][variant])
    if args.out:
        with open(args.out, "a") as sink:
            sink.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
