"""ONNX Runtime's int8/int4 weight paths at a decoder's one-token GEMV shapes, side by side
(issue 52, goal 3: which CPU kernel an int8 or int4 decode step could run on this machine).

    python -m bench.llm.ort_int8_paths --checkpoint build/llm/ckpt-300m [--threads 1]

One ONNX model per path holding the checkpoint's per-layer projections (q/k/v packed,
o, gate/up packed, down) for every layer, each fed the same one-row activations, written
by the onnx target's own quantize step (targets/onnx/quantize.py: ``int8-weight``,
``int4-weight``, ``int8-dynamic``) from one float model, plus ``u8u8``: 8-bit weights
with zero point 128 and DynamicQuantizeMatMul, which MLAS runs without AVX2's 16-bit
saturation (no recipe: kept to ask whether it would be faster). The paths run in turns,
the order reversed every other round. ``--threads 1`` times each run by the thread's CPU
time (ORT runs a one-thread session on the caller's thread), which the other processes of
a shared machine move far less than wall time; ``--threads 2`` is wall time, for a quiet
machine. Also printed: each path's SQNR against the float products on the same rows.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np

RECIPES = ("int8-weight", "int4-weight", "int8-dynamic")


def projections(config: dict) -> list[tuple[int, int]]:
    """(K, N) of one decoder layer's weight matmuls as the build packs them."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads")
    head = config.get("head_dim") or hidden // heads
    return [(hidden, (heads + 2 * (kv or heads)) * head), (heads * head, hidden),
            (hidden, 2 * inter), (inter, hidden)]


def float_model(shapes: list[tuple[int, int]], layers: int, folder: Path, seed: int = 0):
    """The float model (weights N(0, 0.02), in a file beside it) and its path."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    widths = sorted({k for k, _ in shapes})
    nodes, weights, outputs = [], [], []
    for layer in range(layers):
        for index, (k, n) in enumerate(shapes):
            name = f"l{layer}_{index}"
            weights.append(numpy_helper.from_array(
                (rng.standard_normal((k, n)) * 0.02).astype(np.float32), f"{name}_w"))
            nodes.append(helper.make_node("MatMul", [f"x{k}", f"{name}_w"], [name], name=name))
            outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, n]))
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1, k]) for k in widths]
    model = helper.make_model(helper.make_graph(nodes, "gemv", inputs, outputs, weights),
                              opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "float.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="float.onnx.data")
    return path


def recipe_model(source: Path, recipe: str, block: int, folder: Path) -> Path:
    """The onnx target's quantize step on the float model, saved as ``recipe``.onnx."""
    import onnx

    from targets.onnx.quantize import quantize_model

    model, _report = quantize_model(source, recipe, [], block=block)
    path = folder / f"{recipe}-{block}.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True,
                    location=f"{path.name}.data")
    return path


def with_accuracy_level(path: Path, level: int) -> Path:
    """A copy of the MatMulNBits model at ``path`` computing at accuracy ``level`` (the
    same weight files)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for node in model.graph.node:
        for attribute in node.attribute:
            if node.op_type == "MatMulNBits" and attribute.name == "accuracy_level":
                attribute.i = level
    copy = path.with_name(f"{path.stem}-acc{level}.onnx")
    onnx.save_model(model, str(copy))
    return copy


def u8u8_model(source: Path, folder: Path) -> Path:
    """DynamicQuantizeMatMul with 8-bit unsigned weights (per column, zero point 128)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source))
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    del model.graph.initializer[:]
    nodes = []
    for node in model.graph.node:
        w = weights[node.input[1]]
        scale = (np.abs(w).max(0) / 127).astype(np.float32)
        codes = (np.round(w / scale) + 128).astype(np.uint8)
        stem = node.input[1]
        model.graph.initializer.extend([
            numpy_helper.from_array(codes, f"{stem}_u8"), numpy_helper.from_array(scale, f"{stem}_s"),
            numpy_helper.from_array(np.full(w.shape[1], 128, np.uint8), f"{stem}_z")])
        nodes.append(helper.make_node("DynamicQuantizeMatMul",
                                      [node.input[0], f"{stem}_u8", f"{stem}_s", f"{stem}_z"],
                                      list(node.output), domain="com.microsoft"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    path = folder / "u8u8.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="u8u8.onnx.data")
    return path


def path_models(shapes: list[tuple[int, int]], layers: int, folder: Path,
                blocks: list[int], levels: tuple[int, ...] = ()) -> dict[str, Path]:
    """{path name: its model in ``folder``}, with the float model ``float.onnx``; models
    already there are reused. ``levels``: MatMulNBits accuracy levels to time besides the
    recipes' 4 (int8 activations), e.g. 1 (float32 compute)."""
    source = folder / "float.onnx"
    if not source.exists():
        float_model(shapes, layers, folder)
    paths = {}
    for recipe in RECIPES:
        for block in (blocks if recipe.endswith("-weight") else [blocks[0]]):
            name = f"{recipe}-b{block}" if recipe.endswith("-weight") else recipe
            path = folder / f"{recipe}-{block}.onnx"
            paths[name] = path if path.exists() else recipe_model(source, recipe, block, folder)
    for name in [n for n in paths if n.startswith("int") and "-weight-" in n]:
        for level in levels:
            paths[f"{name}-acc{level}"] = with_accuracy_level(paths[name], level)
    paths["u8u8"] = folder / "u8u8.onnx"
    if not paths["u8u8"].exists():
        u8u8_model(source, folder)
    return paths


def session(path: Path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.log_severity_level = 3
    # the sessions take turns: a pool left spinning after its run takes a core from the next
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def sqnr_db(got: list, want: list) -> float:
    noise = sum(float(((g - w) ** 2).sum()) for g, w in zip(got, want))
    return 10 * np.log10(sum(float((w ** 2).sum()) for w in want) / max(noise, 1e-30))


def measure(sessions: dict, feeds: dict, rounds: int, threads: int) -> dict:
    clock = time.thread_time if threads == 1 else time.perf_counter
    times = {name: [] for name in sessions}
    order = list(sessions.items())
    for name, s in order:
        s.run(None, feeds)
    for r in range(rounds):
        for name, s in (order if r % 2 == 0 else order[::-1]):
            start = clock()
            s.run(None, feeds)
            times[name].append(clock() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="build/llm/ckpt-300m")
    parser.add_argument("--layers", type=int, help="default: the checkpoint's")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--blocks", default="128,256", help="MatMulNBits block sizes")
    parser.add_argument("--levels", default="", help="MatMulNBits accuracy levels besides "
                                                      "4, e.g. 1 (float32 compute: slow)")
    parser.add_argument("--rows", action="store_true", help="also each -weight model's "
                        "MatMulNBits run by our own kernels (bench/llm/rows), as NAME+rows")
    parser.add_argument("--out", help="append the result as one JSON line")
    parser.add_argument("--models", help="a folder to keep the models in (and reuse: a run "
                                         "on a quiet machine need not quantize)")
    args = parser.parse_args()
    logging.disable(logging.INFO)  # ORT's quantizer logs each weight
    config = json.loads((Path(args.checkpoint) / "config.json").read_text())
    shapes, layers = projections(config), args.layers or config["num_hidden_layers"]
    rng = np.random.default_rng(1)
    feeds = {f"x{k}": rng.standard_normal((1, k)).astype(np.float32)
             for k in sorted({k for k, _ in shapes})}
    with tempfile.TemporaryDirectory(prefix="ort-int8-paths-") as scratch:
        folder = Path(args.models or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        paths = path_models(shapes, layers, folder, [int(b) for b in args.blocks.split(",")],
                            tuple(int(v) for v in args.levels.split(",") if v))
        want = session(folder / "float.onnx", 1).run(None, feeds)
        sessions = {name: session(p, args.threads) for name, p in paths.items()}
        if args.rows:
            from bench.llm.rows import opened_with_rows
            with opened_with_rows():
                sessions.update({f"{name}+rows": session(p, args.threads)
                                 for name, p in paths.items() if name.endswith(("-b128",
                                                                                "-b256"))})
        accuracy = {name: sqnr_db(s.run(None, feeds), want) for name, s in sessions.items()}
        times = measure(sessions, feeds, args.rounds, args.threads)
    weights = layers * sum(k * n for k, n in shapes)
    rows = {}
    for name, values in times.items():
        t = np.array(values)
        rows[name] = {"min_ms": t.min() * 1e3, "p25_ms": np.percentile(t, 25) * 1e3,
                      "median_ms": np.median(t) * 1e3,
                      "gweights_per_s": weights / np.median(t) / 1e9, "sqnr_db": accuracy[name]}
        print(f"{name:27s} median {rows[name]['median_ms']:7.2f} ms (p25 "
              f"{rows[name]['p25_ms']:7.2f}, min {rows[name]['min_ms']:7.2f})  "
              f"{rows[name]['gweights_per_s']:5.1f} G weights/s  SQNR {accuracy[name]:5.1f} dB")
    if args.out:
        import onnxruntime

        from bench.common import machine_header
        row = {**machine_header(onnxruntime=onnxruntime.__version__), "threads": args.threads,
               "clock": "thread CPU" if args.threads == 1 else "wall", "layers": layers,
               "shapes": shapes, "rounds": args.rounds, "paths": rows}
        with open(args.out, "a") as sink:
            sink.write(json.dumps(row) + "\n")

if __name__ == "__main__":
    main()
