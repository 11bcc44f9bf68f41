"""What int4 rows' rounding alone does to the generation gate: the build's validation
(exporter/lm/validate.py: its prompts, greedy tokens, teacher-forced top-1 and KL against
eager float32) run on eager models, with no artifact and no kernel.

    python bench/int4_rows_gate.py [--checkpoint DIR | --layers N] [--device cuda]

The "artifact" is the same checkpoint in float32 with every linear's weight replaced by
what its int4 rows hold (int4_rows.pack of the fp16 weight, as an int4-weight cuda build
packs it) and the token table by int8 rows (one scale a row, as the build stores it). Its
top-1 and KL against the float32 model are what a correct int4 build can reach at best on
these weights: a build far below them computes something else. Without --checkpoint, a
random LLaMA of the 1.1B shape (``--layers``: fewer layers) as decode_step_cuda.py makes.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def rounded(model: torch.nn.Module) -> torch.nn.Module:
    """A copy whose linears hold their int4 rows' weights and whose token table holds its
    int8 rows' (float32 math otherwise)."""
    from targets.aoti.kernels import int4_rows, reference
    copied = copy.deepcopy(model)
    with torch.no_grad():
        for module in copied.modules():
            if isinstance(module, torch.nn.Linear):
                group = int4_rows.group_of(module.in_features)
                if group is not None:
                    packed, scales = int4_rows.pack(module.weight.half(), group)
                    module.weight.copy_(reference.int4_weight(packed, scales))
        table = copied.get_input_embeddings().weight
        scale = (table.abs().amax(-1, keepdim=True) / 127).half().float().clamp_min(1e-12)
        table.copy_((table / scale).round().clamp(-127, 127) * scale)
    return copied


def gate(model: torch.nn.Module, max_context: int = 512, chunk: int = 256) -> dict:
    """The validation's record for ``rounded(model)`` against ``model``: the same cases,
    the rounded model's own greedy tokens, teacher-forced logits of both over them."""
    from exporter.lm.gate import EagerLogits, GenerationGate, judge_case
    from exporter.lm.validate import generation_cases, hf_greedy
    lm = SimpleNamespace(model=model, tokenizer=None)
    generation = SimpleNamespace(max_context=max_context, prefill_chunk=chunk,
                                 decoder_start=(), cache=SimpleNamespace(layers=[]))
    cases = generation_cases(lm, generation, seed=0)
    quantized = rounded(model)
    eager, own = EagerLogits(model), EagerLogits(quantized)
    check = GenerationGate.for_build("fp16", "int4-weight")
    rows = []
    for index, (prompt, new_tokens) in enumerate(cases):
        tokens = hf_greedy(quantized, prompt, new_tokens)
        logits = own.at(prompt + tokens, len(prompt) - 1, len(tokens))
        # "consistency" (a decode step against a fresh prefill) is only recorded: not checked here
        got = {"tokens": torch.tensor(tokens), "logits": logits, "consistency": logits[1]}
        row = judge_case(f"case{index}", eager, prompt, hf_greedy(model, prompt, new_tokens),
                         got, check)
        rows.append({k: row[k] for k in ("case", "prompt_tokens", "new_tokens",
                                         "top1_agreement", "mean_kl", "tokens_match")})
    record = check.record(rows, cases[0][1])
    return {k: record[k] for k in ("top1_agreement", "mean_kl", "cases")} | {"rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    import transformers as tf
    if args.checkpoint:
        model = tf.LlamaForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32)
    else:
        from bench.generation_cuda import SIZES
        torch.manual_seed(0)
        shape = {**SIZES["1b"], **({"num_hidden_layers": args.layers} if args.layers else {})}
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**shape, max_position_embeddings=2048,
                                                   bos_token_id=1, eos_token_id=2,
                                                   initializer_range=0.02))
    model = model.to(args.device).eval()
    found = gate(model)
    found["layers"] = model.config.num_hidden_layers
    print(json.dumps(found), flush=True)


if __name__ == "__main__":
    main()
