"""ONNX Runtime GenAI's own decode loop against a plain Python ONNX Runtime session of the
same model file, fed as ORT GenAI feeds it (positions after a 128-token prompt, a growing
attention mask, past/present sharing one buffer of --max-length rows), alternating in one
process: decode time per token each, to tell ORT GenAI's loop from its kernels
(MatMulNBits and GroupQueryAttention run alike in both).

    python bench/llm/genai_session_ab.py [MODEL_DIR] [--rounds 7] [--option KEY=VALUE ...]

MODEL_DIR: an ORT GenAI model folder (genai_config.json, model.onnx), default the 300M
comparison's blocks-of-128 build. --option adds a session config entry to the plain
session (e.g. session.set_denormal_as_zero=1) to try what might close the gap.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

DEFAULT = "build/llm/engines-ckpt-300m/ortgenai-int4-b128-model"
PROMPT = list(range(5, 133))
STEPS = 120


def genai_loop(og, model, max_length: int) -> float:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(PROMPT)
    generator.generate_next_token()
    start = time.perf_counter()
    for _ in range(STEPS):
        generator.generate_next_token()
    return (time.perf_counter() - start) / STEPS * 1e3


def plain_session(ort, path: str, options: list[str], threads: int, max_length: int,
                  heads: int, head_size: int):
    settings = ort.SessionOptions()
    settings.intra_op_num_threads, settings.inter_op_num_threads = threads, 1
    for option in options:
        key, _, value = option.partition("=")
        settings.add_session_config_entry(key, value)
    session = ort.InferenceSession(path, settings, providers=["CPUExecutionProvider"])
    binding = session.io_binding()
    cache = {}
    for arg in session.get_inputs():
        if arg.name.startswith("past_key_values."):
            cache[arg.name] = np.zeros((1, heads, max_length, head_size), np.float32)
            binding.bind_cpu_input(arg.name, cache[arg.name])
    for out in session.get_outputs():
        past = out.name.replace("present.", "past_key_values.")
        if past in cache:  # written where the past lies, as past_present_share_buffer
            binding.bind_output(out.name, "cpu", 0, np.float32, list(cache[past].shape),
                                cache[past].ctypes.data)
        else:
            binding.bind_output(out.name, "cpu")

    def run() -> float:
        ids = np.array([[7]], np.int64)
        start = time.perf_counter()
        for step in range(STEPS):
            binding.bind_cpu_input("input_ids", ids)
            binding.bind_cpu_input("attention_mask",
                                   np.ones((1, len(PROMPT) + 1 + step), np.int64))
            session.run_with_iobinding(binding)
            logits = binding.get_outputs()[0].numpy()
            ids = np.array([[int(logits[0, -1].argmax())]], np.int64)
        return (time.perf_counter() - start) / STEPS * 1e3
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", nargs="?", default=DEFAULT)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--option", action="append", default=[])
    args = parser.parse_args()
    import onnxruntime as ort
    import onnxruntime_genai as og
    config = og.Config(args.model_dir)
    config.clear_providers()
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": args.threads, "inter_op_num_threads": 1}}}}))
    model = og.Model(config)
    with open(f"{args.model_dir}/genai_config.json") as fh:
        decoder = json.load(fh)["model"]["decoder"]
    runs = {"genai_loop_ms": lambda: genai_loop(og, model, args.max_length),
            "plain_session_ms": plain_session(ort, f"{args.model_dir}/model.onnx", args.option,
                                              args.threads, args.max_length,
                                              decoder["num_key_value_heads"],
                                              decoder["head_size"])}
    for run in runs.values():
        run()  # warm-up
    times = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            times[name].append(run())
    print(json.dumps({"options": args.option, "rounds": args.rounds,
                      **{k: round(statistics.median(v), 3) for k, v in times.items()},
                      "plain_over_genai": round(statistics.median(
                          p / g for p, g in zip(times["plain_session_ms"],
                                                times["genai_loop_ms"])), 3)}))


if __name__ == "__main__":
    main()
