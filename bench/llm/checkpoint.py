"""A random-weight LLaMA-shaped Hugging Face checkpoint, with a real tokenizer, for the
language-model benchmarks: every engine (Hugging Face, llama.cpp, ONNX Runtime GenAI, our
artifact) converts the same directory, so their greedy tokens can be cross-checked.

    python -m bench.llm.checkpoint --size 300m --out build/llm/ckpt-300m

The directory holds what ``save_pretrained`` writes (config.json, model.safetensors,
generation_config.json) plus tokenizer.json / tokenizer_config.json. Weights come from
``torch.manual_seed(seed)`` and the model's own initialisation, so the same size and seed
give the same files. Random weights generate junk text; the benchmarks feed token ids.

The tokenizer is a SentencePiece-style BPE with byte fallback (the layout of Llama 2's
tokenizer.json: ids 0-2 are <unk> <s> </s>, 3-258 the bytes <0x00>..<0xFF>), trained with
the ``tokenizers`` package on this Python's standard-library sources, so nothing downloads.
That layout matters: llama.cpp's converter recognises it (``LlamaHfVocab``) without a
pre-tokenizer hash, where a byte-level GPT-2-style BPE of our own would be rejected.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import sysconfig
from pathlib import Path

# LLaMA shapes. 300m: ~291M parameters (GQA 16/4, head dim 64) for the 2-core machine;
# 1b: TinyLlama-1.1B's shape for the GPU machine; tiny: ~5M for tests (vocab 4096 so the
# tokenizer trains in a second).
SIZES: dict[str, dict] = {
    "tiny": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=688, vocab_size=4096),
    "300m": dict(hidden_size=1024, num_hidden_layers=20, num_attention_heads=16,
                 num_key_value_heads=4, intermediate_size=2816, vocab_size=32000),
    "1b": dict(hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4, intermediate_size=5632, vocab_size=32000),
}
# initializer_range 0.1, not LLaMA's 0.02: at 0.02 greedy decoding of a random model falls
# into one token (tiny) or a 3-token loop (300m), so engines would "agree" on anything; at
# 0.1 every token differs and top-1 leads top-2 by a median 0.56 logits (300m, 32 tokens).
COMMON = dict(max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
              hidden_act="silu", tie_word_embeddings=False, initializer_range=0.1,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
SPECIALS = ["<unk>", "<s>", "</s>"]
BYTE_TOKENS = [f"<0x{i:02X}>" for i in range(256)]
STAMP = "bench-llm-checkpoint.json"  # what wrote the directory: size, seed, dtype


def param_count(size: str) -> int:
    c = SIZES[size]
    h, layers, inter, vocab = (c["hidden_size"], c["num_hidden_layers"],
                               c["intermediate_size"], c["vocab_size"])
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter + 2 * h
    return layers * per_layer + 2 * vocab * h + h


def training_files(vocab_size: int) -> list[Path]:
    """The standard library's top-level modules, sorted (~5 MB on every CPython), as many
    as ~200 bytes per vocabulary entry need: all of them for 32000, ~1 MB for 4096 (the
    tests' tiny size trains in a second)."""
    files, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        if total >= 200 * vocab_size:
            break
        files.append(path)
        total += path.stat().st_size
    return files


def train_tokenizer(vocab_size: int):
    """A Llama-2-layout BPE tokenizer of exactly ``vocab_size`` ids (see the module doc)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    # The byte tokens go in as special tokens only so they take ids 3..258 (as in Llama's
    # file); they are ordinary vocabulary afterwards (see _as_llama_json).
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS + BYTE_TOKENS,
                                  limit_alphabet=200, show_progress=False)
    files = [str(p) for p in training_files(vocab_size)]
    tok.train(files, trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"tokenizer trained to {tok.get_vocab_size()} ids, not {vocab_size}:"
                           f" {len(files)} training files are too few")
    return _as_llama_json(json.loads(tok.to_str()))


def _as_llama_json(data: dict) -> dict:
    """Keep only <unk> <s> </s> as added tokens; <s> is prepended as in Llama."""
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] in SPECIALS]
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
    }
    return data


def write_tokenizer(out: Path, vocab_size: int) -> None:
    (out / "tokenizer.json").write_text(json.dumps(train_tokenizer(vocab_size),
                                                   ensure_ascii=False))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
              "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>",
              "add_bos_token": True, "add_eos_token": False, "model_max_length": 2048,
              "clean_up_tokenization_spaces": False}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>"},
        indent=2))


def write_checkpoint(size: str, out: Path, seed: int = 0, dtype: str = "float32") -> Path:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(**SIZES[size], **COMMON, architectures=["LlamaForCausalLM"])
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype)).eval()
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                               do_sample=False)
    # one file (model.safetensors): every converter reads it, none needs the shard index
    model.save_pretrained(out, max_shard_size="50GB")
    write_tokenizer(out, config.vocab_size)
    stamp = {**_identity(size, seed, dtype), "params": param_count(size),
             "python": sys.version.split()[0]}
    (out / STAMP).write_text(json.dumps(stamp, indent=2))
    return out


def _identity(size: str, seed: int, dtype: str) -> dict:
    return {"size": size, "seed": seed, "dtype": dtype, "config": {**SIZES[size], **COMMON}}


def ensure_checkpoint(size: str, out: Path, seed: int = 0, dtype: str = "float32") -> Path:
    """Write the checkpoint unless ``out`` already holds this size, shape, seed and dtype."""
    stamp = out / STAMP
    if stamp.is_file():
        have = json.loads(stamp.read_text())
        if all(have.get(k) == v for k, v in _identity(size, seed, dtype).items()):
            return out
    return write_checkpoint(size, out, seed, dtype)


def files_digest(out: Path) -> str:
    """SHA-256 over the checkpoint's files (names and bytes), to show it is deterministic."""
    h = hashlib.sha256()
    for p in sorted(out.iterdir()):
        if p.is_file() and p.name != STAMP:
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--digest", action="store_true", help="print the files' SHA-256")
    args = parser.parse_args(argv)
    out = ensure_checkpoint(args.size, args.out, args.seed, args.dtype)
    print(f"{out}: {args.size}, {param_count(args.size) / 1e6:.1f}M parameters, {args.dtype}")
    if args.digest:
        print(files_digest(out))


if __name__ == "__main__":
    main()
