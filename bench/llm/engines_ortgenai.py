"""ONNX Runtime GenAI: its model builder (``python -m onnxruntime_genai.models.builder
-i CKPT -o OUT -p int4|int8|fp32 -e cpu``, defaults otherwise: int4/int8 are MatMulNBits
weight-only, block 32, accuracy level 4 = int8 activations on the CPU, lm_head included,
embeddings float), then its Generator API with greedy search. The KV cache is the builder's
default, one buffer shared by past and present (``past_present_share_buffer``), sized by
``max_length`` = prompt + new tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys

from bench.llm.registry import EngineRequest, Loaded

PRECISIONS = ("int4", "int8", "fp32")


def model_dir(req: EngineRequest, precision: str):
    return req.work_dir.parent / f"ortgenai-{precision}-model"


def preparer(precision: str):
    def prepare(req: EngineRequest) -> None:
        out = model_dir(req, precision)
        if (out / "genai_config.json").is_file():
            return
        cache = req.work_dir.parent / "ortgenai-cache"
        subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder",
                        "-i", str(req.checkpoint), "-o", str(out), "-p", precision,
                        "-e", "cpu", "-c", str(cache)], check=True)
    return prepare


def loader(precision: str):
    def load(req: EngineRequest) -> Loaded:
        import onnxruntime_genai as og

        path = model_dir(req, precision)
        config = og.Config(str(path))
        config.clear_providers()  # the CPU
        # the thread count goes to the decoder's ONNX Runtime session
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": req.threads, "inter_op_num_threads": 1}}}}))
        model = og.Model(config)

        def generate(prompt, new_tokens, on_token):
            params = og.GeneratorParams(model)
            total = len(prompt) + new_tokens
            # min_length masks the end of sequence until the last token (ignore_eos)
            params.set_search_options(do_sample=False, max_length=total, min_length=total)
            generator = og.Generator(model, params)
            generator.append_tokens(prompt)  # runs the prompt through the model
            while not generator.is_done():
                generator.generate_next_token()
                on_token(int(generator.get_next_tokens()[0]))

        files = sorted(p for p in path.iterdir() if p.name.startswith("model.onnx"))
        variant = {"int4": "int4 MatMulNBits block 32, int8 activations",
                   "int8": "int8 MatMulNBits block 32, int8 activations",
                   "fp32": "fp32"}[precision]
        return Loaded(generate, variant, files,
                      notes=f"onnxruntime-genai {og.__version__}, GQA, shared KV buffer")
    return load
