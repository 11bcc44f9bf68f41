"""One engine in one process (``bench.llm.compare`` starts it): ``--phase prepare`` converts
files, ``--phase measure`` loads the engine and runs the protocol, then writes the record,
with this process's peak RSS, as JSON to ``--result``. A process per engine keeps one
engine's memory and threads out of another's figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

from bench.llm import protocol
from bench.llm.engine import EngineRequest
from bench.llm.registry import get_engine, import_engine_modules


def request(args) -> EngineRequest:
    work = Path(args.work_dir) / args.engine
    work.mkdir(parents=True, exist_ok=True)
    return EngineRequest(checkpoint=Path(args.checkpoint), work_dir=work, threads=args.threads,
                         device=args.device, max_tokens=args.prompt_tokens + args.new_tokens)


def measure(args) -> protocol.GenRecord:
    rss_before = protocol.rss_mb()
    engine = get_engine(args.engine)
    if args.device not in engine.devices:
        raise SystemExit(f"engine {args.engine} runs on {', '.join(engine.devices)}, "
                         f"not {args.device}")
    req = request(args)
    loaded = engine.load(req)
    vocab = json.loads((req.checkpoint / "config.json").read_text())["vocab_size"]
    prompt = protocol.prompt_ids(vocab, args.prompt_tokens, args.seed)
    record = protocol.measure(args.engine, loaded.variant, loaded.generate, prompt,
                              args.new_tokens, args.repeats, args.threads, args.device,
                              file_bytes=sum(p.stat().st_size for p in loaded.files))
    record.peak_rss_mb = protocol.peak_rss_mb()
    record.rss_before_load_mb = rss_before
    record.peak_gpu_mb = loaded.peak_gpu_mb() if loaded.peak_gpu_mb else None
    record.notes = loaded.notes
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", required=True)
    parser.add_argument("--phase", choices=["prepare", "measure"], default="measure")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine-module", action="append", default=[])
    parser.add_argument("--result", help="write the record here as JSON")
    args = parser.parse_args(argv)
    import_engine_modules(args.engine_module)
    if args.phase == "prepare":
        engine = get_engine(args.engine)
        if engine.prepare:
            engine.prepare(request(args))
        return
    record = measure(args)
    text = json.dumps(dataclasses.asdict(record))
    if args.result:
        Path(args.result).write_text(text)
    else:
        print(text)
    # the interpreter's teardown (torch.compile's workers, ORT sessions) adds nothing
    os._exit(0)


if __name__ == "__main__":
    main()
