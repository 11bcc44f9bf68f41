"""One decode token's attention in ONNX Runtime on the CPU, per cached position (issue 52,
goal 3: what attention costs in the int4 step, and whether another op sequence is cheaper).

    python -m bench.llm.ort_attention --checkpoint build/llm/ckpt-300m --positions 1,128,192,250

Two ways over the checkpoint's heads, all its layers, a static cache of ``--slots``:
``gqa`` is the onnx target's node (targets/onnx/packed_attention.py): GroupQueryAttention
on the packed q/k/v row with the rotary inside, past and present bound to one buffer as the
runtime binds them (runtime/executors/ort_binding.py). ``composed`` is the cheapest plain
sequence we could write for one token: the query heads of each key/value head as one
FusedMatMul against the whole cache (transposed), an additive mask, Softmax, MatMul; it
leaves out the rotary and the cache write, so it is a lower bound for that route.
``--threads 1`` times by the thread's CPU time (robust to a shared machine's load).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

_MS = "com.microsoft"


def gqa_model(heads: int, kv: int, head: int, slots: int, layers: int):
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    half = np.arange(head // 2) / (head // 2)
    angles = np.arange(slots)[:, None] / (10000.0 ** half)[None]
    tables = [numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
              numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin")]
    inputs = [helper.make_tensor_value_info("qkv", T.FLOAT, [1, 1, (heads + 2 * kv) * head]),
              helper.make_tensor_value_info("seqlens_k", T.INT32, [1]),
              helper.make_tensor_value_info("total", T.INT32, [1])]
    nodes, outputs = [], []
    for layer in range(layers):
        past = [f"past_k{layer}", f"past_v{layer}"]
        inputs += [helper.make_tensor_value_info(n, T.FLOAT, [1, kv, slots, head]) for n in past]
        made = [f"out{layer}", f"present_k{layer}", f"present_v{layer}"]
        nodes.append(helper.make_node(
            "GroupQueryAttention", ["qkv", "", "", *past, "seqlens_k", "total", "cos", "sin"],
            made, domain=_MS, num_heads=heads, kv_num_heads=kv, do_rotary=1))
        outputs += [helper.make_tensor_value_info(n, T.FLOAT, None) for n in made]
    return helper.make_graph(nodes, "gqa", inputs, outputs, tables)


def composed_model(heads: int, kv: int, head: int, slots: int, layers: int):
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    shapes = [numpy_helper.from_array(np.array([1, kv, heads // kv, head], np.int64), "grouped"),
              numpy_helper.from_array(np.array([1, 1, heads * head], np.int64), "rows")]
    inputs = [helper.make_tensor_value_info("q", T.FLOAT, [1, 1, heads * head]),
              helper.make_tensor_value_info("mask", T.FLOAT, [1, 1, 1, slots])]
    nodes, outputs = [helper.make_node("Reshape", ["q", "grouped"], ["q_grouped"])], []
    for layer in range(layers):
        k, v = f"past_k{layer}", f"past_v{layer}"
        inputs += [helper.make_tensor_value_info(n, T.FLOAT, [1, kv, slots, head]) for n in (k, v)]
        nodes += [helper.make_node("FusedMatMul", ["q_grouped", k], [f"s{layer}"], domain=_MS,
                                   transB=1, alpha=head ** -0.5),
                  helper.make_node("Add", [f"s{layer}", "mask"], [f"m{layer}"]),
                  helper.make_node("Softmax", [f"m{layer}"], [f"p{layer}"], axis=-1),
                  helper.make_node("MatMul", [f"p{layer}", v], [f"a{layer}"]),
                  helper.make_node("Reshape", [f"a{layer}", "rows"], [f"out{layer}"])]
        outputs.append(helper.make_tensor_value_info(f"out{layer}", T.FLOAT, None))
    return helper.make_graph(nodes, "composed", inputs, outputs, shapes)


def bound_run(graph, feeds: dict, in_place: dict, threads: int):
    """A function running ``graph`` once through IO binding, ``in_place`` outputs written
    over their inputs' arrays (as the runtime binds the cache)."""
    import onnx
    import onnxruntime as ort

    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17),
                                                         onnx.helper.make_opsetid(_MS, 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.log_severity_level = threads, 3
    # the two sessions take turns: a pool left spinning would take a core from the other
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    io = session.io_binding()
    for name, array in feeds.items():
        io.bind_cpu_input(name, array)
    for out in session.get_outputs():
        if out.name in in_place:
            array = feeds[in_place[out.name]]
            io.bind_output(out.name, "cpu", 0, np.float32, list(array.shape), array.ctypes.data)
        else:
            io.bind_output(out.name, "cpu")
    return lambda: session.run_with_iobinding(io)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="build/llm/ckpt-300m")
    parser.add_argument("--slots", type=int, default=256, help="the static cache's length")
    parser.add_argument("--positions", default="1,128,192,250")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rows", action="store_true",
                        help="also the same model on our own attention op (bench/llm/rows)")
    parser.add_argument("--out", help="append the result as one JSON line")
    args = parser.parse_args()
    config = json.loads((Path(args.checkpoint) / "config.json").read_text())
    heads, layers = config["num_attention_heads"], config["num_hidden_layers"]
    kv = config.get("num_key_value_heads") or heads
    head = config.get("head_dim") or config["hidden_size"] // heads
    rng = np.random.default_rng(0)
    cache = {f"past_{x}{n}": rng.standard_normal((1, kv, args.slots, head)).astype(np.float32)
             for n in range(layers) for x in "kv"}
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    rows = []
    for position in map(int, args.positions.split(",")):
        gqa = bound_run(gqa_model(heads, kv, head, args.slots, layers), {
            "qkv": rng.standard_normal((1, 1, (heads + 2 * kv) * head)).astype(np.float32),
            "seqlens_k": np.array([position], np.int32),
            "total": np.array([position + 1], np.int32), **cache},
            {f"present_{x}{n}": f"past_{x}{n}" for n in range(layers) for x in "kv"},
            args.threads)
        if args.rows:  # the same model and feeds, on our attention op
            from bench.llm.rows import opened_with_rows
            with opened_with_rows():
                rows_run = bound_run(gqa_model(heads, kv, head, args.slots, layers), {
                    "qkv": rng.standard_normal((1, 1, (heads + 2 * kv) * head)).astype(
                        np.float32), "seqlens_k": np.array([position], np.int32),
                    "total": np.array([position + 1], np.int32), **cache},
                    {f"present_{x}{n}": f"past_{x}{n}" for n in range(layers) for x in "kv"},
                    args.threads)
        mask = np.where(np.arange(args.slots) <= position, 0, -np.inf).astype(np.float32)
        composed = bound_run(composed_model(heads, kv, head, args.slots, layers), {
            "q": rng.standard_normal((1, 1, heads * head)).astype(np.float32),
            "mask": mask.reshape(1, 1, 1, -1), **cache}, {}, args.threads)
        ways = [("gqa", gqa), ("composed", composed)] + ([("rows", rows_run)] if args.rows
                                                          else [])
        times = {way: [] for way, _ in ways}
        for _, run in ways:
            run()
        for call in range(args.calls):  # in turns, the order reversed every other call
            for way, run in (ways if call % 2 else ways[::-1]):
                start = clock()
                run()
                times[way].append(clock() - start)
        row = {"position": position, **{f"{way}_us_per_layer": float(np.median(t)) / layers * 1e6
                                        for way, t in times.items()}}
        rows.append(row)
        print(f"position {position:4d}: gqa {row['gqa_us_per_layer']:6.1f} us a layer, "
              f"composed (no rotary, no cache write) {row['composed_us_per_layer']:6.1f} us"
              + (f", ours (bench/llm/rows) {row['rows_us_per_layer']:6.1f} us" if args.rows
                 else ""))
    if args.out:
        import onnxruntime

        from bench.common import machine_header
        with open(args.out, "a") as sink:
            sink.write(json.dumps({**machine_header(onnxruntime=onnxruntime.__version__),
                                   "threads": args.threads, "slots": args.slots,
                                   "layers": layers, "rows": rows}) + "\n")


if __name__ == "__main__":
    main()
