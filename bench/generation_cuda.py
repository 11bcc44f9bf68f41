"""Text generation on the GPU machine, in one process per engine where it matters.

    python bench/generation_cuda.py --out DIR [--size 1b] [--skip-tiny]

1. Tiny LLaMA and Gemma-3-style models (tests/models/tiny_lm.py) built for ``cuda`` at
   fp32 and fp16: the generation validation's record, and decode tokens equal with and
   without the decode CUDA graph.
2. A LLaMA-shaped model of about 1.1B parameters (TinyLlama's shape, random weights) at
   fp16: time to first token and decode tokens/s over 128 new tokens after a 128-token
   prompt, batch 1, for the artifact, Hugging Face eager ``generate`` and Hugging Face
   static cache + ``torch.compile(mode="reduce-overhead")``, each after a warm-up run,
   median of the runs; peak GPU memory; the artifact's size.
Rows go to DIR/generation-cuda.jsonl.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SIZES = {  # TinyLlama-1.1B's shape; "small" for a quick check
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
               num_attention_heads=32, num_key_value_heads=4, vocab_size=32000),
    "small": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, vocab_size=32000),
}


def emit(out: Path, row: dict) -> None:
    print(json.dumps(row), flush=True)
    with open(out / "generation-cuda.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")


def tiny_builds(out: Path, families: list[str], dtypes: list[str]) -> None:
    import exporter
    import runtime
    from tests.models import tiny_lm

    for family in families:
        folder = tiny_lm.checkpoint(out / f"tiny-{family}", family)
        for spec in dtypes:  # "fp16", or "fp16+int4-weight" (a weight-only recipe)
            dtype, _, recipe = spec.partition("+")
            # random weights: the labelled gate's bounds widened, the figures recorded
            quant = dict(quantize=recipe, min_top1=0.5, max_kl=1.0) if recipe else {}
            path = out / f"tiny-{family}-{spec}.artifact"
            start = time.perf_counter()
            try:
                built = exporter.build(f"hf:{folder}", task="text-generation", target="cuda",
                                       dtype=dtype, max_context=64, prefill_chunk=16, out=path,
                                       **quant)
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                emit(out, {"what": "tiny build", "family": family, "dtype": spec,
                           "error": f"{type(exc).__name__}: {exc}"[:2000]})
                continue
            record = built.manifest.validation
            graphed = runtime.load(path).generate([1, 5, 9], 40, stop_at_eos=False)
            plain = runtime.load(path, cuda_graphs=False).generate([1, 5, 9], 40,
                                                                   stop_at_eos=False)
            emit(out, {"what": "tiny build", "family": family, "dtype": spec,
                       "seconds": round(time.perf_counter() - start, 1),
                       "passed": record["passed"], "tokens_identical": record["tokens_identical"],
                       "top1": record["top1_agreement"], "kl": record["mean_kl"],
                       "graph_equals_plain": graphed.tokens == plain.tokens,
                       "graphed_decode_tok_s": graphed.stats["decode_tokens_per_s"],
                       "plain_decode_tok_s": plain.stats["decode_tokens_per_s"]})


def big_checkpoint(folder: Path, size: str, std: float, layers: int | None = None) -> Path:
    """A random LLaMA of SIZES[size] (``layers``: that many of its layers instead)."""
    import transformers as tf
    torch.manual_seed(0)
    shape = {**SIZES[size], **({"num_hidden_layers": layers} if layers else {})}
    config = tf.LlamaConfig(**shape, max_position_embeddings=2048, bos_token_id=1,
                            eos_token_id=2, initializer_range=std)
    with torch.device("cuda"):
        model = tf.LlamaForCausalLM(config)
    model.save_pretrained(folder)
    return folder


def timed_runs(generate, runs: int) -> dict:
    generate()  # warm-up (compiles, captures, allocator)
    rows = []
    for _ in range(runs):
        torch.cuda.synchronize()
        rows.append(generate())
    return {key: statistics.median(r[key] for r in rows) for key in rows[0]}


def artifact_engine(path: Path, prompt: list[int], new: int):
    import runtime
    program = runtime.load(path)

    def run() -> dict:
        result = program.generate(prompt, new, stop_at_eos=False)
        assert len(result.tokens) == new
        return {"ttft_s": result.stats["ttft_s"],
                "decode_tok_s": result.stats["decode_tokens_per_s"]}
    return run


def hf_engine(folder: Path, prompt: list[int], new: int, compiled: bool):
    import transformers as tf
    model = tf.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float16).cuda()
    model.eval()
    if compiled:  # transformers' own recipe: a static cache makes generate compile the
        # forward itself (CompileConfig: inductor, fullgraph, reduce-overhead CUDA graphs)
        model.generation_config.cache_implementation = "static"
    ids = torch.tensor([prompt], device="cuda")

    class FirstToken(tf.StoppingCriteria):  # notes when the first new token exists
        def __init__(self) -> None:
            self.first = None

        def __call__(self, input_ids, scores, **kwargs):
            if self.first is None:
                torch.cuda.synchronize()
                self.first = time.perf_counter()
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def run() -> dict:
        first = FirstToken()
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                 stopping_criteria=[first], pad_token_id=0)
        torch.cuda.synchronize()
        end = time.perf_counter()
        assert out.shape[1] == len(prompt) + new
        return {"ttft_s": first.first - start, "decode_tok_s": (new - 1) / (end - first.first)}
    return run


def big_bench(out: Path, size: str, std: float, runs: int, context: int) -> None:
    import exporter
    folder = big_checkpoint(out / f"llama-{size}", size, std)
    artifact = out / f"llama-{size}-fp16.artifact"
    start = time.perf_counter()
    built = exporter.build(f"hf:{folder}", task="text-generation", target="cuda", dtype="fp16",
                           max_context=context, prefill_chunk=256, out=artifact)
    record = built.manifest.validation
    emit(out, {"what": "big build", "size": size, "seconds": round(time.perf_counter() - start),
               "timings": built.timings, "bytes": artifact.stat().st_size,
               "passed": record["passed"], "top1": record["top1_agreement"],
               "kl": record["mean_kl"], "tokens_identical": record["tokens_identical"]})
    prompt = torch.randint(3, SIZES[size]["vocab_size"], (128,),
                           generator=torch.Generator().manual_seed(0)).tolist()
    engines = {"artifact": lambda: artifact_engine(artifact, prompt, 128),
               "hf-eager": lambda: hf_engine(folder, prompt, 128, False),
               "hf-static-compile": lambda: hf_engine(folder, prompt, 128, True)}
    for name, make in engines.items():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        try:
            figures = timed_runs(make(), runs)
        except Exception as exc:  # noqa: BLE001 - recorded, the next engine runs
            emit(out, {"what": "decode", "engine": name, "error": f"{type(exc).__name__}: {exc}"[:1500]})
            continue
        emit(out, {"what": "decode", "engine": name, "size": size, "prompt": 128, "new": 128,
                   **{k: round(v, 5) for k, v in figures.items()},
                   "peak_gpu_mb": round(torch.cuda.max_memory_allocated() / 2**20),
                   "gpu": torch.cuda.get_device_name(), "torch": torch.__version__})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", default="1b", choices=sorted(SIZES))
    parser.add_argument("--std", type=float, default=0.02, help="weights' init std")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--skip-tiny", action="store_true")
    parser.add_argument("--families", default="llama,gemma3",
                        help="comma list of tests/models/tiny_lm.py families, or 'all'")
    parser.add_argument("--dtypes", default="fp32,fp16,bf16",
                        help="comma list; DTYPE+RECIPE adds a weight-only recipe "
                             "(fp16+int4-weight)")
    parser.add_argument("--skip-big", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.skip_tiny:
        from tests.models import tiny_lm
        families = tiny_lm.FAMILIES if args.families == "all" else args.families.split(",")
        tiny_builds(args.out, list(families), args.dtypes.split(","))
    if not args.skip_big:
        big_bench(args.out, args.size, args.std, args.runs, args.context)


if __name__ == "__main__":
    main()
