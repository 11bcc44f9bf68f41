"""Tiny encoder-decoders from configs (random weights, seeded) for the text-generation tests:
Whisper (speech features in), BART, Marian and T5 (text in; T5 with its relative position
bias), and a BART checkpoint folder with a tokenizer trained here (nothing downloads).
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.models.tiny_lm import bpe_tokenizer

VOCAB = 320
_TEXT = dict(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2,
             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
             decoder_ffn_dim=128, max_position_embeddings=96)
# for the models one test builds alone, where the property is no layer's own
_ONE_LAYER = {**_TEXT, "encoder_layers": 1, "decoder_layers": 1}
FAMILIES = ("whisper", "bart", "marian", "t5")


def config(family: str):
    import transformers as tf
    return {
        "whisper": lambda: tf.WhisperConfig(
            **{k: v for k, v in _TEXT.items() if k != "max_position_embeddings"},
            num_mel_bins=16, max_source_positions=24, max_target_positions=96,
            decoder_start_token_id=1, pad_token_id=0, eos_token_id=2, bos_token_id=1),
        "bart": lambda: tf.BartConfig(**_TEXT, decoder_start_token_id=2),
        # BART's shape, numbering its decoder positions from the cache length itself (one
        # layer each side: each numbers its positions alike)
        "mvp": lambda: tf.MvpConfig(**_ONE_LAYER, decoder_start_token_id=2),
        "marian": lambda: tf.MarianConfig(**_TEXT, decoder_start_token_id=0, pad_token_id=0),
        # opus-mt-tc-*'s kind: the source's vocabulary larger than the target's
        "marian-two-vocabs": lambda: tf.MarianConfig(
            **_ONE_LAYER, decoder_vocab_size=VOCAB - 20, share_encoder_decoder_embeddings=False,
            tie_word_embeddings=False, decoder_start_token_id=0, pad_token_id=0),
        "t5": lambda: tf.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128,
                                  num_layers=2, num_decoder_layers=2, num_heads=4,
                                  relative_attention_num_buckets=8,
                                  relative_attention_max_distance=20,
                                  decoder_start_token_id=0, pad_token_id=0, eos_token_id=1),
    }[family]()


def model(family: str, seed: int = 0) -> torch.nn.Module:
    """Random weights, scaled up (std 0.2) so next-token logits are not near-ties."""
    import transformers as tf
    torch.manual_seed(seed)
    cfg = config(family)
    auto = tf.AutoModelForSpeechSeq2Seq if family == "whisper" else tf.AutoModelForSeq2SeqLM
    built = auto.from_config(cfg).eval()
    with torch.no_grad():
        for p in built.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    if family == "whisper":  # set, not update(): update() skips fields the config lacks
        for key, value in WHISPER_GENERATION.items():
            setattr(built.generation_config, key, value)
    return built


# A multilingual Whisper checkpoint's generation config, in this vocabulary: language and
# task tokens, <|notimestamps|>, and the ids its generate suppresses (openai/whisper-*'s
# generation_config.json has these fields, with ~90 suppressed ids)
WHISPER_GENERATION = dict(
    lang_to_id={"<|en|>": 300, "<|fr|>": 301, "<|de|>": 302},
    task_to_id={"translate": 303, "transcribe": 304}, no_timestamps_token_id=305,
    is_multilingual=True, suppress_tokens=[5, 6, 7, 257], begin_suppress_tokens=[220, 2, 237])


def whisper():
    return model("whisper")


def t5():
    return model("t5")


def bart():
    return model("bart")


def mvp():
    return model("mvp")


def marian_two_vocabs():
    return model("marian-two-vocabs")


def checkpoint(folder: Path, family: str = "bart") -> Path:
    """save_pretrained + tokenizer.json (byte-level BPE of VOCAB tokens; the source is
    wrapped in bos ... eos as BART's own tokenizer does)."""
    built = model(family)
    tokenizer = bpe_tokenizer(VOCAB, ["<s>", "<pad>", "</s>", "<unk>"], "<s> $A </s>")
    folder.mkdir(parents=True, exist_ok=True)
    built.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder
