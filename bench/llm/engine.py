"""What an engine of the language-model comparison is: the request it is given and what
its ``load`` returns. A module of its own so that the engines and the registry that names
them both import it, and neither imports the other.

    def load(req: EngineRequest) -> Loaded       # load the model; return its generate()
    def prepare(req: EngineRequest) -> None      # optional: convert/compile into req.work_dir
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from bench.llm.protocol import Generate


@dataclasses.dataclass(frozen=True)
class EngineRequest:
    checkpoint: Path  # the Hugging Face checkpoint directory (bench.llm.checkpoint)
    work_dir: Path  # this engine's own directory for converted files
    threads: int  # intra-op threads (torch, llama.cpp n_threads(_batch), ORT intra_op)
    device: str = "cpu"  # "cpu" or "cuda"
    max_tokens: int = 256  # prompt + new tokens: the KV cache a static engine must hold


@dataclasses.dataclass
class Loaded:
    generate: Generate  # see bench.llm.protocol
    variant: str  # what runs, in words: "fp32", "Q4_0 (output Q6_K)", "int4 block 32"...
    files: list[Path]  # the model files it runs (their sizes are the file_bytes figure)
    peak_gpu_mb: Callable[[], float] | None = None  # where the engine runs on a GPU
    notes: str = ""
