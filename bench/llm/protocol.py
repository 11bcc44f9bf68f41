"""The timing protocol for generating models, the same for every engine.

Engine-independent: standard library and numpy only, so it can move under ``exporter/``
as it is when ``exporter bench`` measures a generating artifact.

An engine hands over one callable::

    generate(prompt_ids: list[int], new_tokens: int, on_token: Callable[[int], None]) -> None

It runs greedy decoding from ``prompt_ids`` for exactly ``new_tokens`` tokens, with the end
of sequence suppressed (its logit masked, as ``min_new_tokens`` / ``ignore_eos`` do), and
calls ``on_token(token_id)`` once per generated token, as soon as that id is on the host.
The protocol stamps each call with ``perf_counter``:

- TTFT = first ``on_token`` - the call (prefill plus the first sampling);
- prefill tokens/s = prompt tokens / TTFT;
- decode tokens/s = (new tokens - 1) / (last ``on_token`` - first ``on_token``).

One warm-up call first (it carries compilation, e.g. torch.compile), then ``repeats``
calls; each figure is the median over them.

Each stamp also reads the process's CPU time (all its threads). On a machine shared with
other work, wall-clock figures fall with the load while CPU time per decoded token mostly
does not (threads that spin while waiting count too), so both are recorded.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable

import numpy as np

Generate = Callable[[list[int], int, Callable[[int], None]], None]


@dataclasses.dataclass
class GenRecord:
    """One engine measured on one prompt: a row of ``build/llm-bench.jsonl``."""
    engine: str  # registry name, e.g. "llamacpp-q4_0"
    variant: str  # what it runs: "fp32", "Q4_0", "int4 (MatMulNBits, block 32)"...
    device: str
    threads: int
    prompt_tokens: int
    new_tokens: int
    decode_steps: int  # timed decode steps: new_tokens - 1
    ttft_s: float
    prefill_tok_s: float
    decode_tok_s: float
    warmup_s: float  # the warm-up call's whole time (compilation included)
    decode_cpu_ms_per_tok: float  # process CPU time per decode step (median call)
    runs: list[dict]  # every timed call: ttft_s, decode_s, decode_cpu_s
    deterministic: bool  # every call generated the same ids
    file_bytes: int  # the model file(s) the engine runs
    peak_rss_mb: float | None = None  # ru_maxrss of the engine's own process
    rss_before_load_mb: float | None = None  # its RSS after imports, before the model loads
    peak_gpu_mb: float | None = None  # torch.cuda.max_memory_allocated, where on a GPU
    token_ids: list[int] = dataclasses.field(default_factory=list)
    notes: str = ""


def prompt_ids(vocab_size: int, length: int = 128, seed: int = 0, low: int = 3) -> list[int]:
    """The benchmark prompt: ``length`` random ids in [low, vocab_size), the same for every
    engine (ids below ``low`` are <unk> <s> </s> in our checkpoints)."""
    rng = np.random.default_rng(seed)
    return [int(i) for i in rng.integers(low, vocab_size, size=length)]


@dataclasses.dataclass
class Call:
    ttft_s: float
    decode_s: float
    decode_cpu_s: float
    token_ids: list[int]


def time_call(generate: Generate, prompt: list[int], new_tokens: int) -> Call:
    stamps: list[float] = []
    cpu: list[float] = []
    ids: list[int] = []

    def on_token(token_id: int) -> None:
        stamps.append(time.perf_counter())
        cpu.append(time.process_time())
        ids.append(int(token_id))

    start = time.perf_counter()
    generate(list(prompt), new_tokens, on_token)
    if len(ids) != new_tokens:
        raise RuntimeError(f"the engine generated {len(ids)} tokens, not {new_tokens}: "
                           "end of sequence must be suppressed")
    return Call(stamps[0] - start, stamps[-1] - stamps[0], cpu[-1] - cpu[0], ids)


def measure(engine: str, variant: str, generate: Generate, prompt: list[int],
            new_tokens: int = 128, repeats: int = 3, threads: int = 0, device: str = "cpu",
            file_bytes: int = 0) -> GenRecord:
    """The protocol: one warm-up call, then ``repeats`` timed calls, medians."""
    if new_tokens < 2 or repeats < 1:
        raise ValueError("new_tokens >= 2 and repeats >= 1 (decode needs two stamps)")
    t0 = time.perf_counter()
    warm = time_call(generate, prompt, new_tokens)
    warmup_s = time.perf_counter() - t0
    calls = [time_call(generate, prompt, new_tokens) for _ in range(repeats)]
    ttft = statistics.median(c.ttft_s for c in calls)
    decode = statistics.median(c.decode_s for c in calls)
    decode_cpu = statistics.median(c.decode_cpu_s for c in calls)
    steps = new_tokens - 1
    return GenRecord(
        engine=engine, variant=variant, device=device, threads=threads,
        prompt_tokens=len(prompt), new_tokens=new_tokens, decode_steps=steps,
        ttft_s=ttft, prefill_tok_s=len(prompt) / ttft, decode_tok_s=steps / decode,
        warmup_s=warmup_s, decode_cpu_ms_per_tok=decode_cpu / steps * 1e3,
        runs=[{"ttft_s": c.ttft_s, "decode_s": c.decode_s, "decode_cpu_s": c.decode_cpu_s}
              for c in calls],
        deterministic=all(c.token_ids == warm.token_ids for c in calls),
        file_bytes=file_bytes, token_ids=calls[0].token_ids)


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading generated ids two engines share (random weights make near-ties, so
    a short prefix after quantization is expected; the float engines should agree long)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def rss_mb() -> float:
    """This process's resident set now (VmRSS), in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb() -> float:
    """The process's peak resident set so far (VmHWM), in MiB. Not ru_maxrss: Linux
    carries the parent's high-water mark into a child across fork and exec, so each
    engine's figure held the driver's size at the spawn (runtime/memory/peak.py)."""
    from runtime.memory.peak import peak_resident_bytes
    peak = peak_resident_bytes()
    return peak / 2**20 if peak is not None else float("nan")
