"""Decoder-only language models from Hugging Face transformers, as ``...ForCausalLM``.

Each factory builds the real class from a config object with random weights (unit-scaled:
unit_scale.py), ``use_cache=False`` (one full forward pass, no KV cache), and returns
``(model, (), {"input_ids": ..., "attention_mask": ...})`` for one sequence of 16 tokens.
Grouped-query attention (4 query heads sharing 2 key/value heads) wherever the config
has ``num_key_value_heads``; sliding-window models get a window of 8, shorter than the
sequence, so the windowed mask is really exercised.

Configs are tiny on purpose (hidden 64, 2 layers, vocabulary 512, 128 positions): the
suite covers each architecture's operators (rotary variants, ALiBi, soft-capping, MoE
routing, selective state-space scans) and every model has to export and compile in
seconds on a 2-core machine.
"""

from __future__ import annotations

import torch
import transformers as hf

try:  # a spec file: `exporter build` puts its folder on sys.path, so this folder's own
    from unit_scale import unit_scaled
except ImportError:  # imported as bench.coverage.<file>
    from bench.coverage.unit_scale import unit_scaled

VOCAB, SEQ, WINDOW = 512, 16, 8

# Token ids every config here uses, all inside the tiny vocabulary.
_TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)

# The LLaMA-style field names most configs here share: GQA with 4 heads over 2 KV heads.
_LLAMA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              use_cache=False, **_TOKENS)


def _text_kwargs(vocab: int = VOCAB, seq: int = SEQ) -> dict[str, torch.Tensor]:
    """Random token ids (above the special ids, below ``vocab``) and an all-ones mask,
    from a seeded generator."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab, (1, seq), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones(1, seq, dtype=torch.int64)}


def _causal_lm(model_cls, config):
    """The model in eval mode with its example kwargs, unit-scaled (unit_scale.py); the
    caller has seeded torch."""
    return unit_scaled(model_cls(config).eval(), (), _text_kwargs())


# ---------------------------------------------------------------------------- LLaMA family


def llama():
    torch.manual_seed(0)
    return _causal_lm(hf.LlamaForCausalLM, hf.LlamaConfig(**_LLAMA))


def mistral():
    torch.manual_seed(0)
    config = hf.MistralConfig(**_LLAMA, sliding_window=WINDOW)
    return _causal_lm(hf.MistralForCausalLM, config)


def mixtral():
    torch.manual_seed(0)
    # Sparse mixture of experts: 4 experts, top-2 routing per token.
    config = hf.MixtralConfig(**_LLAMA, num_local_experts=4, num_experts_per_tok=2,
                              sliding_window=None)
    return _causal_lm(hf.MixtralForCausalLM, config)


def qwen2():
    torch.manual_seed(0)
    return _causal_lm(hf.Qwen2ForCausalLM, hf.Qwen2Config(**_LLAMA))


def qwen3():
    torch.manual_seed(0)
    # Qwen3 adds RMSNorm on queries and keys; head_dim given explicitly as in its configs.
    return _causal_lm(hf.Qwen3ForCausalLM, hf.Qwen3Config(**_LLAMA, head_dim=16))


def phi3():
    torch.manual_seed(0)
    return _causal_lm(hf.Phi3ForCausalLM, hf.Phi3Config(**_LLAMA))


def phi():
    torch.manual_seed(0)
    # Phi-2 style: parallel attention/MLP, rotary on half of each head (the default 0.5).
    return _causal_lm(hf.PhiForCausalLM, hf.PhiConfig(**_LLAMA))


def stablelm():
    torch.manual_seed(0)
    # Rotary on a quarter of each head (the default), LayerNorm instead of RMSNorm.
    return _causal_lm(hf.StableLmForCausalLM, hf.StableLmConfig(**_LLAMA))


def starcoder2():
    torch.manual_seed(0)
    config = hf.Starcoder2Config(**_LLAMA, sliding_window=WINDOW)
    return _causal_lm(hf.Starcoder2ForCausalLM, config)


def olmo2():
    torch.manual_seed(0)
    return _causal_lm(hf.Olmo2ForCausalLM, hf.Olmo2Config(**_LLAMA))


def gemma():
    torch.manual_seed(0)
    return _causal_lm(hf.GemmaForCausalLM, hf.GemmaConfig(**_LLAMA, head_dim=16))


def gemma2():
    torch.manual_seed(0)
    # Alternating sliding-window and global layers, tanh soft-capping of attention logits
    # and final logits (the defaults 50 and 30).
    config = hf.Gemma2Config(**_LLAMA, head_dim=16, query_pre_attn_scalar=16,
                             sliding_window=WINDOW)
    return _causal_lm(hf.Gemma2ForCausalLM, config)


def gemma3():
    torch.manual_seed(0)
    # Gemma 3's text model: QK-norm, one sliding and one global layer with their own RoPE.
    config = hf.Gemma3TextConfig(**_LLAMA, head_dim=16, query_pre_attn_scalar=16,
                                 sliding_window=WINDOW,
                                 layer_types=["sliding_attention", "full_attention"])
    return _causal_lm(hf.Gemma3ForCausalLM, config)


# ---------------------------------------------------------------------------- GPT family


def gpt2():
    torch.manual_seed(0)
    config = hf.GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=64, n_layer=2, n_head=4,
                           use_cache=False, **_TOKENS)
    return _causal_lm(hf.GPT2LMHeadModel, config)


def gpt_bigcode():
    torch.manual_seed(0)
    # StarCoder (1): multi-query attention, one key/value head for all query heads.
    config = hf.GPTBigCodeConfig(vocab_size=VOCAB, n_positions=128, n_embd=64, n_layer=2,
                                 n_head=4, multi_query=True, use_cache=False, **_TOKENS)
    return _causal_lm(hf.GPTBigCodeForCausalLM, config)


def gptj():
    torch.manual_seed(0)
    # Parallel attention/MLP, interleaved rotary on the first 8 dims of each head.
    config = hf.GPTJConfig(vocab_size=VOCAB, n_positions=128, n_embd=64, n_layer=2, n_head=4,
                           rotary_dim=8, use_cache=False, **_TOKENS)
    return _causal_lm(hf.GPTJForCausalLM, config)


def gpt_neox():
    torch.manual_seed(0)
    config = hf.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                              num_attention_heads=4, intermediate_size=128,
                              max_position_embeddings=128, use_cache=False, **_TOKENS)
    return _causal_lm(hf.GPTNeoXForCausalLM, config)


def opt():
    torch.manual_seed(0)
    config = hf.OPTConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, ffn_dim=128,
                          num_attention_heads=4, max_position_embeddings=128,
                          word_embed_proj_dim=64, use_cache=False,
                          pad_token_id=1, bos_token_id=2, eos_token_id=2)
    return _causal_lm(hf.OPTForCausalLM, config)


def bloom():
    torch.manual_seed(0)
    # ALiBi position biases instead of position embeddings.
    config = hf.BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4,
                            use_cache=False, **_TOKENS)
    return _causal_lm(hf.BloomForCausalLM, config)


def falcon():
    torch.manual_seed(0)
    # The Falcon-40B/180B layout: GQA (num_kv_heads) with parallel attention and MLP.
    config = hf.FalconConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_kv_heads=2,
                             new_decoder_architecture=True, ffn_hidden_size=128,
                             max_position_embeddings=128, use_cache=False, **_TOKENS)
    return _causal_lm(hf.FalconForCausalLM, config)


# ---------------------------------------------------------------------------- state-space


def mamba():
    torch.manual_seed(0)
    # Selective scan in PyTorch (no mamba-ssm kernels on CPU): a recurrence over the sequence.
    config = hf.MambaConfig(vocab_size=VOCAB, hidden_size=64, state_size=8,
                            num_hidden_layers=2, expand=2, conv_kernel=4, time_step_rank=8,
                            use_cache=False, **_TOKENS)
    return _causal_lm(hf.MambaForCausalLM, config)
