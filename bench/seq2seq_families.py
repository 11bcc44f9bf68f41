"""Generating builds of encoder-decoder families (issue 23): tiny random-weight configs of
transformers' sequence-to-sequence models, built with ``--task text-generation`` and the
exact gate (greedy tokens equal to Hugging Face ``generate``). One JSON line per family.

    python bench/seq2seq_families.py --target onnx [FAMILY ...]

The four of tests/models/tiny_seq2seq.py (Whisper, BART, Marian, T5) run in the tests;
these are the others, and the ones known to fail, with why.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_BART = dict(vocab_size=320, d_model=64, encoder_layers=2, decoder_layers=2,
             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
             decoder_ffn_dim=128, max_position_embeddings=96)
_T5 = dict(vocab_size=320, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
           num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20,
           decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)


def _configs() -> dict:
    import transformers as t
    no_positions = {k: v for k, v in _BART.items() if k != "max_position_embeddings"}
    return {
        "mbart": (t.MBartForConditionalGeneration, t.MBartConfig(**_BART)),
        "pegasus": (t.PegasusForConditionalGeneration, t.PegasusConfig(**_BART)),
        "m2m100": (t.M2M100ForConditionalGeneration, t.M2M100Config(**_BART)),
        "blenderbot": (t.BlenderbotForConditionalGeneration, t.BlenderbotConfig(**_BART)),
        "blenderbot-small": (t.BlenderbotSmallForConditionalGeneration,
                             t.BlenderbotSmallConfig(**_BART)),
        "plbart": (t.PLBartForConditionalGeneration, t.PLBartConfig(**_BART)),
        "mt5": (t.MT5ForConditionalGeneration, t.MT5Config(**_T5)),
        "umt5": (t.UMT5ForConditionalGeneration, t.UMT5Config(**_T5)),
        # known to fail, each with a clear error
        "mvp": (t.MvpForConditionalGeneration, t.MvpConfig(**_BART)),
        "led": (t.LEDForConditionalGeneration, t.LEDConfig(
            **no_positions, max_encoder_position_embeddings=96,
            max_decoder_position_embeddings=96, attention_window=[8, 8])),
        "longt5": (t.LongT5ForConditionalGeneration, t.LongT5Config(**_T5, local_radius=4)),
        "switch-transformers": (t.SwitchTransformersForConditionalGeneration,
                                t.SwitchTransformersConfig(**_T5, num_experts=4,
                                                           expert_capacity=8)),
        "speech-to-text": (t.Speech2TextForConditionalGeneration, t.Speech2TextConfig(
            **no_positions, max_source_positions=64, max_target_positions=96,
            input_feat_per_channel=16, num_conv_layers=2, conv_channels=32)),
    }


def model(family: str) -> torch.nn.Module:
    """Seeded random weights, scaled up (std 0.2) so next-token logits are not near-ties."""
    cls, config = _configs()[family]
    torch.manual_seed(0)
    built = cls(config).eval()
    with torch.no_grad():
        for p in built.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    return built


def whisper_tiny_shape() -> torch.nn.Module:
    """openai/whisper-tiny's dimensions (39M parameters, 80 mel bins x 3000 frames), random
    weights: the bench model of the seq2seq figures (``exporter build
    bench/seq2seq_families.py:whisper_tiny_shape --task text-generation ...``)."""
    import transformers as t
    torch.manual_seed(0)
    config = t.WhisperConfig(vocab_size=51865, num_mel_bins=80, encoder_layers=4,
                             decoder_layers=4, encoder_attention_heads=6,
                             decoder_attention_heads=6, d_model=384, encoder_ffn_dim=1536,
                             decoder_ffn_dim=1536, max_source_positions=1500,
                             max_target_positions=448, decoder_start_token_id=50258,
                             pad_token_id=50257, eos_token_id=50257, bos_token_id=50257)
    return t.WhisperForConditionalGeneration(config).eval()


def t5_small_shape() -> torch.nn.Module:
    """t5-small's dimensions (60M parameters; 6+6 layers, d_model 512, 32 relative
    buckets), random weights."""
    import transformers as t
    torch.manual_seed(0)
    return t.T5ForConditionalGeneration(t.T5Config(
        vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6,
        num_heads=8, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)).eval()


def main() -> None:
    import exporter
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="onnx")
    parser.add_argument("families", nargs="*")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for family in args.families or list(_configs()):
            started = time.perf_counter()
            row = {"family": family, "target": args.target}
            try:
                built = exporter.build(model(family), task="text-generation",
                                       target=args.target, max_context=48, prefill_chunk=16,
                                       out=Path(folder) / f"{family}.artifact")
                record = built.manifest.validation
                row.update(passed=record["passed"], identical=record["tokens_identical"])
            except Exception as exc:  # noqa: BLE001 - a family's failure is its row
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:240]}"
            row["seconds"] = round(time.perf_counter() - started, 1)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
