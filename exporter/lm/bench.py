"""``exporter bench`` for a generating artifact: time to first token, prefill and decode
tokens/s, peak memory and file size, against Hugging Face on the same weights.

Engines (``--baseline``): the artifact; ``hf-eager`` (transformers ``generate``, greedy,
DynamicCache); ``hf-static`` (transformers' static-cache recipe: ``cache_implementation=
"static"``, the forward compiled with ``torch.compile``; on a GPU transformers compiles it
itself with CUDA graphs). One process, the same prompt of random token ids, greedy, eos
ignored, exactly ``new_tokens`` tokens; after a warm-up each, the engines take turns run
by run and the medians are reported (the machines are shared and noisy). Peak memory: GPU
engines' own peak allocation; on the CPU the artifact's peak resident memory, measured in
a child process that generates (`python -m runtime generate`), the figure a device sees.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

import runtime
from exporter.errors import UserInputError
from exporter.lm.source import load_language_model
from exporter.model.cast import DTYPES
from exporter.model.hf_spec import HfOptions

BASELINES = ("hf-eager", "hf-static")


def bench_generation(artifact: str | Path, *, baselines: tuple[str, ...] = BASELINES,
                     prompt_tokens: int | None = None, new_tokens: int | None = None,
                     runs: int = 5, warmup: int = 1, cuda_graphs: bool = True,
                     stage: Callable) -> dict:
    unknown = set(baselines) - set(BASELINES)
    if unknown:
        raise UserInputError(f"unknown baseline(s) for a generating artifact: "
                             f"{', '.join(sorted(unknown))}", hint=f"choose from: "
                             f"{', '.join(BASELINES)}")
    with stage("load artifact"):
        program = runtime.load(artifact, cuda_graphs=cuda_graphs)
    manifest, generator = program.manifest, program.generator
    prompt_tokens, new_tokens = fitted_lengths(prompt_tokens, new_tokens, generator.max_context)
    device = generator.device
    prompt = torch.randint(0, generator.vocab, (prompt_tokens,),
                           generator=torch.Generator().manual_seed(0)).tolist()
    source = _source(generator)
    if source is not None:  # an encoder-decoder: the decoder prompt starts as generate's
        prompt = (generator.decoder_start + prompt)[:prompt_tokens]
    engines = {"artifact": _artifact_engine(program, prompt, new_tokens, source)}
    if baselines:
        with stage("load the Hugging Face model"):
            model = _reference(manifest, device)
        encoder = {} if source is None else {model.main_input_name: source[None].to(
            device=device, dtype=next(model.parameters()).dtype)
            if source.is_floating_point() else source[None].to(device)}
        for name in baselines:
            engines[name] = _hf_engine(model, prompt, new_tokens, static=name == "hf-static",
                                       encoder=encoder)
    rows = _take_turns(engines, runs, warmup, device, stage)
    result = {"artifact": str(artifact), "target": manifest.target, "device": str(device),
              "dtype": manifest.build.get("settings", {}).get("dtype", "fp32"),
              "quantize": manifest.build.get("settings", {}).get("quantize"),
              "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "runs": runs,
              "warmup": warmup,
              "threads": torch.get_num_threads(), "file_bytes": Path(artifact).stat().st_size,
              "cache_bytes": generator.cache.nbytes, "engines": rows}
    if source is not None:
        result["source"] = list(source.shape)
    if device.type == "cpu":
        with stage("peak memory of the artifact (child process)"):
            result["engines"]["artifact"]["peak_rss_mb"] = _child_peak_rss(
                artifact, prompt, new_tokens, source)
    artifact_decode = rows["artifact"]["decode_tokens_per_s"]
    result["ratios"] = {f"artifact/{name}": artifact_decode / row["decode_tokens_per_s"]
                        for name, row in rows.items()
                        if name != "artifact" and row.get("decode_tokens_per_s")}
    # the one convention of every bench (exporter/report/speed.py): above 1, faster
    result["speedups"] = {k.removeprefix("artifact/"): v for k, v in result["ratios"].items()}
    return result


def fitted_lengths(prompt: int | None, new: int | None, context: int) -> tuple[int, int]:
    """The issue's 128-token prompt and 128 new tokens, or, where the context is shorter
    and a length is not given, what fits: half the context for the prompt, the rest for
    the new tokens. Counted as ``generate`` counts: the last new token is never fed back,
    so it takes no slot."""
    if prompt is None:
        prompt = min(128, max(1, context // 2) if new is None else max(1, context + 1 - new))
    if new is None:
        new = max(2, min(128, context + 1 - prompt))
    if prompt + new > context + 1:
        raise UserInputError(f"a {prompt}-token prompt and {new} new tokens do not fit the "
                             f"artifact's context of {context} (the last new token takes "
                             "no slot)", hint="lower --prompt-tokens/--new-tokens, or rebuild "
                                              "with a larger --max-context")
    return prompt, new


def _take_turns(engines: dict, runs: int, warmup: int, device: torch.device,
                stage: Callable) -> dict:
    samples: dict[str, list[dict]] = {name: [] for name in engines}
    for name, run in engines.items():
        with stage(f"warm up {name} ({warmup} untimed)"):
            for _ in range(warmup):
                run()
    peaks = {}
    with stage(f"generate ({runs} runs per engine, taking turns)"):
        for _ in range(runs):
            for name, run in engines.items():
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                samples[name].append(run())
                if device.type == "cuda":
                    peaks[name] = max(peaks.get(name, 0), torch.cuda.max_memory_allocated(device))
    rows = {}
    for name, values in samples.items():
        # rounded alike for every engine: seconds to the microsecond, rates to 0.01
        rows[name] = {key: round(statistics.median(v[key] for v in values),
                                 6 if key.endswith("_s") else 2) for key in values[0]}
        if name in peaks:
            rows[name]["peak_gpu_mb"] = round(peaks[name] / 2**20, 1)
    return rows


def _source(generator) -> torch.Tensor | None:
    """An encoder-decoder's source for the bench (its time is in time to first token):
    random token ids as many as the encoder takes, or random features of its shape."""
    spec = generator.source
    if spec is None:
        return None
    random = torch.Generator().manual_seed(1)
    if spec["input"] == "input_features":
        return torch.randn(*spec["shape"], generator=random)
    return torch.randint(0, spec.get("vocab") or generator.vocab, (spec["bound"],),
                         generator=random)


def _artifact_engine(program, prompt: list[int], new_tokens: int,
                     source: torch.Tensor | None) -> Callable[[], dict]:
    given = {} if source is None else {"source": source}

    def run() -> dict:
        result = program.generate(prompt, new_tokens, stop_at_eos=False, **given)
        stats = result.stats
        return {"ttft_s": stats["ttft_s"], "prefill_tokens_per_s": stats["prefill_tokens_per_s"],
                "decode_tokens_per_s": stats["decode_tokens_per_s"]}
    return run


def _reference(manifest, device: torch.device) -> torch.nn.Module:
    settings = manifest.build.get("settings", {})
    lm = load_language_model(manifest.source["spec"], HfOptions.from_settings(settings))
    dtype = DTYPES.get(settings.get("dtype"), torch.float32)
    return lm.model.to(device=device, dtype=dtype).eval()


def _hf_engine(model: torch.nn.Module, prompt: list[int], new_tokens: int, *,
               static: bool, encoder: dict) -> Callable[[], dict]:
    """``encoder``: an encoder-decoder's source (``prompt`` is then its decoder's)."""
    from transformers import GenerationConfig, StoppingCriteria

    from exporter.lm.validate import hf_generate

    device = next(model.parameters()).device
    config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              do_sample=False, pad_token_id=0,
                              cache_implementation="static" if static else None)
    forward = model.forward
    if static and device.type == "cpu":  # on GPUs transformers compiles it itself
        forward = torch.compile(model.forward)
    ids = torch.tensor([prompt], device=device)

    class FirstToken(StoppingCriteria):
        first: float | None = None

        def __call__(self, input_ids, scores, **kwargs):
            if self.first is None:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                self.first = time.perf_counter()
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def run() -> dict:
        first = FirstToken()
        model.forward = forward
        start = time.perf_counter()
        out = hf_generate(model, ids, config, encoder, stopping_criteria=[first])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        end = time.perf_counter()
        if out.shape[1] != len(prompt) + new_tokens:
            raise RuntimeError(f"transformers generated {out.shape[1] - len(prompt)} tokens")
        ttft = first.first - start
        return {"ttft_s": ttft, "prefill_tokens_per_s": len(prompt) / ttft,
                "decode_tokens_per_s": (new_tokens - 1) / (end - first.first)}
    return run


def _child_peak_rss(artifact: str | Path, prompt: list[int], new_tokens: int,
                    source: torch.Tensor | None) -> float:
    """Peak resident MB of a fresh process that loads the artifact and generates."""
    import tempfile
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    cmd = [sys.executable, "-m", "runtime", "generate", str(artifact), "--prompt-ids",
           ",".join(map(str, prompt)), "--max-new-tokens", str(new_tokens), "--ignore-eos",
           "--json"]
    with tempfile.TemporaryDirectory() as folder:
        if source is not None and source.is_floating_point():
            from safetensors.torch import save_file
            save_file({"features": source.contiguous()}, f"{folder}/features.safetensors")
            cmd += ["--source-features", f"{folder}/features.safetensors"]
        elif source is not None:
            cmd += ["--source-ids", ",".join(map(str, source.tolist()))]
        return _peak_rss_of(cmd, env)


def _peak_rss_of(cmd: list[str], env: dict) -> float | None:
    """The child's own peak, as `runtime generate --json` reads it (VmHWM): the wait's
    ru_maxrss carried this process's size, baselines included, into the child's."""
    done = subprocess.run(cmd, capture_output=True, env=env)
    result = json.loads(done.stdout or b"{}") if done.returncode == 0 else {}
    if not result.get("tokens"):
        raise UserInputError("the artifact did not generate in a child process",
                             details=[done.stderr.decode()[-500:]])
    return result.get("peak_rss_mb")
