"""What the exporter's generation validation runs in its own process (``python -m
exporter.lm.cases ARTIFACT --cases IN --out OUT``): the artifact loaded by the real runtime,
greedy generation from each prompt, keeping every step's logits, and a fresh prefill over
prompt + first token, whose logits must equal the decode step's (the cache is consistent).
exporter/lm/validate.py judges the results against eager.

Inputs are keyed ``{case}/prompt`` (int64 [L]) and ``{case}/new_tokens`` (int64 [1]), and
for an encoder-decoder ``{case}/source`` (token ids or input features);
outputs ``{case}/tokens`` [n], ``{case}/logits`` [n, vocab] (float32, the logits each token
was chosen from) and ``{case}/consistency`` [vocab].
"""

from __future__ import annotations

import argparse
import sys

import torch

import runtime
from runtime.__main__ import Stage, preload
from runtime.errors import ToolchainError
from runtime.host.tensorio import load_tensors, save_tensors


def run_generation_cases(program, cases_path: str, stage: Stage = Stage(None)
                         ) -> dict[str, torch.Tensor]:
    generator = program.generator
    with generator.holding():  # the cases' steps in turn on its one cache
        return _run_cases(generator, cases_path, stage)


def _run_cases(generator, cases_path: str, stage: Stage) -> dict[str, torch.Tensor]:
    grouped: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in load_tensors(cases_path).items():
        case, _, name = key.partition("/")
        grouped.setdefault(case, {})[name] = tensor
    results = {}
    for case, inputs in sorted(grouped.items()):
        stage(f"generating from case {case!r}")
        prompt = inputs["prompt"].tolist()
        if "source" in inputs:  # an encoder-decoder: its cross cache, for this case
            generator.set_source(inputs["source"])
        tokens, logits = greedy_with_logits(generator, prompt, int(inputs["new_tokens"][0]))
        results[f"{case}/tokens"] = torch.tensor(tokens, dtype=torch.int64)
        results[f"{case}/logits"] = torch.stack(logits)
        results[f"{case}/consistency"] = generator.prefill_prompt(
            prompt + tokens[:1]).float().cpu()
    return results


def greedy_with_logits(generator, prompt: list[int], count: int
                       ) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens (eos does not stop it) and the logits each was chosen from."""
    logits = generator.prefill_prompt(prompt)
    tokens, rows = [], []
    for step in range(count):
        rows.append(logits.float().cpu())
        tokens.append(int(logits.argmax()))
        if step + 1 < count:
            logits = generator.step(torch.tensor([tokens[-1]]), len(prompt) + step)[-1]
    return tokens, rows


def main(argv: list[str] | None = None) -> int:
    """Exit codes as ``python -m runtime run-cases``'s: a refusal is the error's own code,
    which the build's crash report reads (exporter/validation/validate.py)."""
    parser = argparse.ArgumentParser(prog="python -m exporter.lm.cases")
    parser.add_argument("artifact")
    parser.add_argument("--cases", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--preload", action="append", default=[])
    parser.add_argument("--stage-out", help="rewrite the stage reached here as it goes")
    args = parser.parse_args(argv)
    stage = Stage(args.stage_out)
    try:
        stage("importing the --preload modules")
        preload(args.preload)
        stage("loading the artifact")
        program = runtime.load(args.artifact)
        results = run_generation_cases(program, args.cases, stage)
        stage("writing the outputs")
        save_tensors(args.out, results)
    except ToolchainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
