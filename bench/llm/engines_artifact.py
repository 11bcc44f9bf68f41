"""Our generating artifacts as engines of the language-model comparison (bench/llm/):
``artifact-cpu`` (AOTInductor, fp32), ``artifact-cpu-int8`` (int8-dynamic: oneDNN int8
GEMMs), ``artifact-cpu-int4`` (ATen's int4 CPU GEMM, passes/quantize/int4_cpu.py),
``artifact-onnx`` (ONNX Runtime, fp32) and ``artifact-onnx-int8`` / ``artifact-onnx-int4``
(MatMulNBits weights, int8 activations, on the target's own kernels; ``-ort``: on ONNX
Runtime GenAI's kernels, our graph; ``-avx2``: the same files on the kernels' AVX2 tiles
where the CPU has AVX-512 VNNI),
``artifact-executorch`` (ExecuTorch with XNNPACK, fp32) and its ``-int8`` / ``-int4``. ``prepare`` builds with ``exporter build``
(validation included) into the engine's work folder; ``load`` generates through the
runtime, greedy, end of sequence masked as the protocol asks (bench/llm/protocol.py).

    python -m bench.llm.compare --engine-module bench.llm.engines_artifact \\
        --engines artifact-onnx-int4,ortgenai-int4,llamacpp-q4_0 ...
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from bench.llm.engine import EngineRequest, Loaded
from bench.llm.registry import register_engine

ROOT = Path(__file__).resolve().parents[2]
BUILDS = {"artifact-cpu": ("cpu", None), "artifact-cpu-int8": ("cpu", "int8-dynamic"),
          "artifact-cpu-int4": ("cpu", "int4-weight"), "artifact-onnx": ("onnx", None),
          # the GEMVs and decode attention on the target's own AVX2 kernels (the default
          # on x86-64 with AVX2+FMA: targets/onnx/kernels); -ort: ONNX Runtime's own ops
          "artifact-onnx-int8": ("onnx", "int8-weight"),
          "artifact-onnx-int4": ("onnx", "int4-weight"),
          "artifact-onnx-int8-ort": ("onnx", "int8-weight", "--no-own-kernels"),
          "artifact-onnx-int4-ort": ("onnx", "int4-weight", "--no-own-kernels"),
          # ORT's dynamic quantizer (MatMulInteger, u8s8; 7-bit weights on x86)
          "artifact-onnx-int8-dynamic": ("onnx", "int8-dynamic"),
          # MatMulNBits blocks of 32 (llama.cpp Q4_0's and ORT GenAI's default); the
          # onnx target's defaults are 256 at 8 bits, 128 at 4 (targets/onnx/card.py)
          "artifact-onnx-int8-b32": ("onnx", "int8-weight", "--quant-block", "32"),
          "artifact-onnx-int4-b32": ("onnx", "int4-weight", "--quant-block", "32"),
          # blocks of 64: MLAS's AVX2 int8-activation kernels have their own 64-wide
          # one-row path (an AVX2-only CPU has no VNNI)
          "artifact-onnx-int8-b64": ("onnx", "int8-weight", "--quant-block", "64"),
          "artifact-onnx-int4-b64": ("onnx", "int4-weight", "--quant-block", "64"),
          "artifact-onnx-int8-b128": ("onnx", "int8-weight", "--quant-block", "128"),
          # blocks of 256: fewer per-block scale steps in MLAS's int8-activation kernels
          "artifact-onnx-int8-b256": ("onnx", "int8-weight", "--quant-block", "256"),
          "artifact-onnx-int4-b256": ("onnx", "int4-weight", "--quant-block", "256"),
          # ExecuTorch with XNNPACK: int8-dynamic is per-token int8 activations and int8
          # weights; int4-weight is 8da4w, ExecuTorch's own LLM export recipe
          "artifact-executorch": ("executorch", None),
          "artifact-executorch-int8": ("executorch", "int8-dynamic"),
          "artifact-executorch-int4": ("executorch", "int4-weight")}


def _artifact(name: str, req: EngineRequest) -> Path:
    return req.work_dir / f"{name}.artifact"


def preparer(name: str):
    target, recipe, *flags = BUILDS[name]

    def prepare(req: EngineRequest) -> None:
        out = _artifact(name, req)
        if out.exists():
            return
        cmd = [sys.executable, "-m", "exporter", "build", f"hf:{req.checkpoint}",
               "--task", "text-generation", "--target", target, "--max-context",
               str(req.max_tokens), "--prefill-chunk", "128", "--out", str(out), "-q"]
        if recipe:  # a random-weight model misses the gate's defaults (made for trained
            # weights) even when rounded in eager
            cmd += ["--quantize", recipe, "--min-top1", "0", "--max-kl", "10", *flags]
        subprocess.run(cmd, check=True, cwd=ROOT)
    return prepare


def loader(name: str):
    def load(req: EngineRequest) -> Loaded:
        import torch

        import runtime
        torch.set_num_threads(req.threads)
        path = _artifact(name, req)
        program = runtime.load(path, limits=_limits(path))
        generator = program.generator
        eos = sorted(generator.eos)

        def generate(prompt: list[int], new_tokens: int, on_token) -> None:
            logits = generator.prefill_prompt(prompt)
            position = len(prompt)
            for step in range(new_tokens):
                if eos:  # the protocol masks the end of sequence, as min_new_tokens does
                    logits[eos] = float("-inf")
                token = int(logits.argmax())
                on_token(token)
                if step + 1 < new_tokens:
                    logits = generator.step(torch.tensor([token]), position)[-1]
                    position += 1
        target, recipe, *flags = BUILDS[name]
        return Loaded(generate, f"{target} {recipe or 'fp32'} {' '.join(flags)} (our artifact)",
                      [path])
    return load


def forced_avx2_loader(base: str):
    """``base``'s artifact decoded on the kernels' AVX2 tiles where the CPU has AVX-512
    VNNI too: the library reads targets/onnx/kernels' ISA_ENV when a session registers it,
    so the two can run side by side in one process."""
    import os

    def load(req: EngineRequest) -> Loaded:
        from targets.onnx.kernels import ISA_ENV
        before = os.environ.get(ISA_ENV)
        os.environ[ISA_ENV] = "avx2"
        try:
            loaded = loader(base)(_as(base, req))
        finally:
            if before is None:
                del os.environ[ISA_ENV]
            else:
                os.environ[ISA_ENV] = before
        return dataclasses.replace(loaded, variant=loaded.variant + ", AVX2 tiles forced")
    return load


def _as(base: str, req: EngineRequest) -> EngineRequest:
    return dataclasses.replace(req, work_dir=req.work_dir.parent / base)


def _limits(path: Path):
    """The runtime's limits, raised to this artifact's size: the bench's own builds are
    trusted, and a 1.1B model's fp32 artifact passes the defaults (4.4 GB; its
    ExecuTorch program one 4.4 GB entry, over the 2 GiB an entry may have)."""
    from runtime.format.archive import Limits
    size, default = path.stat().st_size, Limits()
    return dataclasses.replace(
        default, max_archive_bytes=max(default.max_archive_bytes, size),
        max_entry_bytes=max(default.max_entry_bytes, size),
        max_total_bytes=max(default.max_total_bytes, size))


for _name in BUILDS:
    register_engine(_name, loader(_name), prepare=preparer(_name))
for _name in ("artifact-onnx-int8", "artifact-onnx-int4"):
    register_engine(_name + "-avx2", forced_avx2_loader(_name),
                    prepare=lambda req, base=_name: preparer(base)(_as(base, req)))
