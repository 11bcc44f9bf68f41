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

from bench.llm.engine import EngineRequest, Loaded

# "-b128": MatMulNBits blocks of 128 weights (the builder's block_size), as our onnx
# target's default (targets/onnx/quantize.py); plain int4/int8 are the builder's 32
PRECISIONS = ("int4", "int8", "fp32", "int4-b128", "int8-b128")


def model_dir(req: EngineRequest, precision: str):
    return req.work_dir.parent / f"ortgenai-{precision}-model"


def preparer(precision: str):
    def prepare(req: EngineRequest) -> None:
        out = model_dir(req, precision)
        if (out / "genai_config.json").is_file():
            return
        cache = req.work_dir.parent / "ortgenai-cache"
        base, _, block = precision.partition("-b")
        extra = ["--extra_options", f"block_size={block}"] if block else []
        subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder",
                        "-i", str(req.checkpoint), "-o", str(out), "-p", base,
                        "-e", "cpu", "-c", str(cache), *extra], check=True)
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
        base, _, block = precision.partition("-b")
        variant = "fp32" if base == "fp32" else \
            f"{base} MatMulNBits block {block or 32}, int8 activations"
        return Loaded(generate, variant, files,
                      notes=f"onnxruntime-genai {og.__version__}, GQA, shared KV buffer")
    return load
