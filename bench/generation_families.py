"""Generating builds of the issue's decoder families and fifteen more, each a tiny
random-weight config built with `exporter build --task text-generation` (a subprocess,
as a user runs it) and validated by the exact gate (greedy tokens equal to Hugging Face
`generate`, 3 prompts x 32 tokens). On onnx it also counts the attention layers that run
as one packed GroupQueryAttention with the rotary inside (targets/onnx/packed_attention.py).

    python bench/generation_families.py --target onnx [--families granite,olmo2] [--out DIR]

One JSON row per family on stdout.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_COMMON = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def configs() -> dict:
    """The issue's families (tests/models/tiny_lm.py's configs) and fifteen more."""
    import transformers as tf

    from tests.models import tiny_lm
    c = _COMMON
    issue = {family: (lambda f=family: tiny_lm.config(f)) for family in tiny_lm.FAMILIES}
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    return {
        **issue,
        "llama3-rope": lambda: tf.LlamaConfig(**c, rope_scaling=llama3),
        "granite": lambda: tf.GraniteConfig(**c),
        "olmo": lambda: tf.OlmoConfig(**c),
        "olmo2": lambda: tf.Olmo2Config(**c),
        "stablelm": lambda: tf.StableLmConfig(**c),
        "gpt_neox": lambda: tf.GPTNeoXConfig(**{k: v for k, v in c.items()
                                                if k != "num_key_value_heads"}),
        "phi": lambda: tf.PhiConfig(**c),
        "cohere": lambda: tf.CohereConfig(**c),
        "starcoder2": lambda: tf.Starcoder2Config(**c),
        "smollm3": lambda: tf.SmolLM3Config(**c, pad_token_id=0),
        "falcon": lambda: tf.FalconConfig(vocab_size=384, hidden_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, new_decoder_architecture=True,
                                          num_kv_heads=2),
        "glm": lambda: tf.GlmConfig(**c, pad_token_id=0),
        "qwen2-moe": lambda: tf.Qwen2MoeConfig(**c, num_experts=4, num_experts_per_tok=2,
                                               moe_intermediate_size=32,
                                               shared_expert_intermediate_size=64),
        "mixtral": lambda: tf.MixtralConfig(**c, num_local_experts=4, num_experts_per_tok=2),
    }


def checkpoint(folder: Path, make) -> Path:
    import transformers as tf
    if not folder.exists():
        torch.manual_seed(0)
        model = tf.AutoModelForCausalLM.from_config(make()).eval()
        with torch.no_grad():  # std 0.2: next-token logits that are not near-ties
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, 0.2)
        model.save_pretrained(folder)
    return folder


def packed_layers(artifact: Path) -> tuple[int, int]:
    """(GroupQueryAttention nodes with the rotary inside, all of them) in the artifact."""
    import onnx
    packed = total = 0
    with zipfile.ZipFile(artifact) as archive:
        for name in archive.namelist():
            if name.endswith(".onnx"):
                graph = onnx.load(io.BytesIO(archive.read(name)), load_external_data=False).graph
                for node in graph.node:
                    if node.op_type == "GroupQueryAttention":
                        total += 1
                        packed += any(a.name == "do_rotary" and a.i for a in node.attribute)
    return packed, total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="onnx")
    parser.add_argument("--families", help="comma-separated (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "families")
    args = parser.parse_args()
    table = configs()
    for name in args.families.split(",") if args.families else table:
        folder = checkpoint(args.out / name, table[name])
        out = args.out / f"{name}-{args.target}.artifact"
        out.unlink(missing_ok=True)
        start = time.time()
        done = subprocess.run([sys.executable, "-m", "exporter", "build", f"hf:{folder}",
                               "--task", "text-generation", "--target", args.target,
                               "--max-context", "64", "--prefill-chunk", "16", "--out",
                               str(out), "--json"], capture_output=True, text=True, cwd=ROOT)
        row = {"family": name, "target": args.target, "rc": done.returncode,
               "seconds": round(time.time() - start)}
        if done.returncode == 0:
            record = json.loads(done.stdout)["validation"]
            row.update(passed=record["passed"], identical=record["tokens_identical"],
                       top1=round(record["top1_agreement"], 3))
            if args.target == "onnx":
                row["packed_attention"] = "%d of %d" % packed_layers(out)
        else:
            lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
            row["error"] = " | ".join(lines[:3])[:400]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
