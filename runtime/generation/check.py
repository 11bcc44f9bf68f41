"""What the exporter's generation validation runs in its own process (``python -m runtime
generation-cases``): greedy generation from each prompt, keeping every step's logits, and
a fresh prefill over prompt + first token, whose logits must equal the decode step's
(the cache is consistent). exporter/lm/validate.py judges the results against eager.

Inputs are keyed ``{case}/prompt`` (int64 [L]) and ``{case}/new_tokens`` (int64 [1]), and
for an encoder-decoder ``{case}/source`` (token ids or input features);
outputs ``{case}/tokens`` [n], ``{case}/logits`` [n, vocab] (float32, the logits each token
was chosen from) and ``{case}/consistency`` [vocab].
"""

from __future__ import annotations

import torch

from runtime.tensorio import load_tensors


def run_generation_cases(program, cases_path: str) -> dict[str, torch.Tensor]:
    generator = program.generator
    with generator.holding():  # the cases' steps in turn on its one cache
        return _run_cases(generator, cases_path)


def _run_cases(generator, cases_path: str) -> dict[str, torch.Tensor]:
    grouped: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in load_tensors(cases_path).items():
        case, _, name = key.partition("/")
        grouped.setdefault(case, {})[name] = tensor
    results = {}
    for case, inputs in sorted(grouped.items()):
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
