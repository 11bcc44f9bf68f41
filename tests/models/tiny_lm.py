"""Tiny causal LMs from configs (random weights, seeded) for the text-generation tests:
one per family the generation export supports, and a checkpoint folder with a real
byte-level BPE ``tokenizer.json`` trained here on a few sentences (nothing downloads).
"""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 384
_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
CORPUS = ["the quick brown fox jumps over the lazy dog", "a model that leaves the notebook",
          "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
          "in 1905 einstein published four papers", "hello world, hello device"] * 20


def config(family: str, window: int = 12):
    """A small config of ``family``; the sliding-window families get ``window``."""
    import transformers as tf
    heads16 = dict(head_dim=16)
    return {
        "llama": lambda: tf.LlamaConfig(**_COMMON),
        "llama-one-layer": lambda: tf.LlamaConfig(**{**_COMMON, "num_hidden_layers": 1}),
        "mistral": lambda: tf.MistralConfig(**_COMMON, sliding_window=window),
        "qwen2": lambda: tf.Qwen2Config(**_COMMON),
        "qwen3": lambda: tf.Qwen3Config(**_COMMON, **heads16),
        "phi3": lambda: tf.Phi3Config(**_COMMON, pad_token_id=0),
        "gemma": lambda: tf.GemmaConfig(**_COMMON, **heads16),
        "gemma2": lambda: tf.Gemma2Config(**_COMMON, **heads16, sliding_window=window),
        "gemma3": lambda: tf.Gemma3TextConfig(**_COMMON, **heads16, sliding_window=window,
                                              sliding_window_pattern=2),
        "gpt2": lambda: tf.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4,
                                      n_positions=256),
        # rotaries whose angles follow the sequence length (exporter/lm/rope.py); one
        # layer: the rope is the same in each
        "llama-dynamic-rope": lambda: tf.LlamaConfig(
            **{**_COMMON, "num_hidden_layers": 1}, rope_parameters=dict(
                rope_type="dynamic", rope_theta=10000.0, factor=2.0)),
        "phi3-longrope": lambda: tf.Phi3Config(  # one layer, as above
            **{**_COMMON, "max_position_embeddings": 128, "num_hidden_layers": 1}, pad_token_id=0,
            original_max_position_embeddings=32, rope_parameters=dict(
                rope_type="longrope", rope_theta=10000.0,
                short_factor=[1.0 + 0.1 * i for i in range(8)],
                long_factor=[2.0 + 0.3 * i for i in range(8)])),
        # longrope on the full layers only (rope settings per layer type)
        "gemma3-longrope": lambda: tf.Gemma3TextConfig(
            **{**_COMMON, "max_position_embeddings": 128}, **heads16, sliding_window=window,
            sliding_window_pattern=2, rope_parameters={
                "full_attention": dict(rope_type="longrope", rope_theta=1e6,
                                       original_max_position_embeddings=32,
                                       short_factor=[1.0] * 8, long_factor=[2.0] * 8),
                "sliding_attention": dict(rope_type="default", rope_theta=1e4)}),
        # Llama 4's attention temperature on its NoPE layer: a scale by absolute position,
        # which transformers numbers from the cache's length (exporter/lm/wrapper.py)
        "llama4-temperature": lambda: tf.Llama4TextConfig(
            **_COMMON, head_dim=16, intermediate_size_mlp=128, num_local_experts=4,
            num_experts_per_tok=1, moe_layers=[1], no_rope_layers=[1, 0],
            attention_chunk_size=None, layer_types=["full_attention"] * 2,
            floor_scale=4, attn_scale=0.5, pad_token_id=0),
        # differential attention: its attention calls get the cached values split and
        # repeated (the in-place step must not stand in for them)
        "diffllama": lambda: tf.DiffLlamaConfig(**_COMMON),
        # KV sharing: the last two layers attend with the keys and values of the last
        # earlier layer of their kind, and write no cache of their own
        "gemma4-kv-shared": lambda: tf.Gemma4TextConfig(
            **{**_COMMON, "num_hidden_layers": 4}, **heads16, sliding_window=window,
            layer_types=["sliding_attention", "full_attention"] * 2, num_kv_shared_layers=2,
            vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=16, pad_token_id=0),
        # a mixture of experts (transformers' grouped experts op on the CPU fallback)
        "mixtral": lambda: tf.MixtralConfig(**_COMMON, num_local_experts=4,
                                            num_experts_per_tok=2),
        # multi-head latent attention: the cache holds compressed latents, not keys/values
        "deepseek_v3": lambda: tf.DeepseekV3Config(
            **{**_COMMON, "num_key_value_heads": 4}, q_lora_rank=48, kv_lora_rank=32,
            qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, first_k_dense_replace=2,
            n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
            moe_intermediate_size=32),
    }[family]()


FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3", "gpt2")


def model(family: str, window: int = 12, seed: int = 0) -> torch.nn.Module:
    """Random weights, scaled up (std 0.2) so next-token logits are not near-ties."""
    import transformers as tf
    torch.manual_seed(seed)
    lm = tf.AutoModelForCausalLM.from_config(config(family, window)).eval()
    with torch.no_grad():
        for p in lm.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    return lm


def checkpoint(folder: Path, family: str = "gemma3", window: int = 12) -> Path:
    """save_pretrained + tokenizer.json (byte-level BPE, VOCAB tokens, bos/eos set)."""
    lm = model(family, window)
    tokenizer = bpe_tokenizer(VOCAB, ["<pad>", "<s>", "</s>"], "<s> $A")
    lm.config.bos_token_id, lm.config.eos_token_id, lm.config.pad_token_id = 1, 2, 0
    lm.generation_config.bos_token_id, lm.generation_config.eos_token_id = 1, 2
    lm.generation_config.pad_token_id = 0
    folder.mkdir(parents=True, exist_ok=True)
    lm.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def bpe_tokenizer(vocab: int, special: list[str], template: str):
    """A byte-level BPE of ``vocab`` tokens trained on CORPUS; ``special`` first (ids 0..),
    ``template`` the single-sequence post-processor (e.g. "<s> $A")."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    used = [token for token in special if token in template]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(token, special.index(token)) for token in used])
    return tokenizer


def factory():
    """A FILE.py:NAME spec: a transformers causal LM returned alone."""
    return model("llama")


def one_layer():
    """factory's llama with one layer, for builds whose property is no layer's own (a gate
    missed, a broken kernel caught): about a third less to capture and export."""
    return model("llama-one-layer")


def gemma3_longrope():
    return model("gemma3-longrope")


def llama_dynamic_rope():
    return model("llama-dynamic-rope")


def phi3_longrope():
    return model("phi3-longrope")
