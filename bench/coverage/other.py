"""Everything else from Hugging Face transformers: encoder-decoders (text and speech),
dense prediction (detection, segmentation, depth), audio encoders and two-tower
image-text models.

Each factory builds the real transformers class from a config object with random weights,
unit-scaled (unit_scale.py), and returns ``(model, (), kwargs)`` with the tensors its
``forward()`` takes by name:
``input_ids``/``attention_mask``/``decoder_input_ids`` (seq2seq), ``input_features`` +
``decoder_input_ids`` (Whisper), ``pixel_values`` (dense), ``input_values`` (audio).

Configs are tiny on purpose (width 32, 2 layers, 2 heads, 32-64 px images, a tenth of a
second of audio): the suite covers each architecture's operators and graph patterns
(cross-attention, relative position buckets, sine position embeddings, feature pyramids,
atrous convolutions, strided audio convolutions) and every model has to export and compile
in seconds on a 2-core machine.
"""

from __future__ import annotations

import torch
import transformers as hf

try:  # a spec file: `exporter build` puts its folder on sys.path, so this folder's own
    from unit_scale import unit_scaled
except ImportError:  # imported as bench.coverage.<file>
    from bench.coverage.unit_scale import unit_scaled

VOCAB, SEQ, DECODER_SEQ = 512, 16, 8
_TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _ids(length: int, gen: torch.Generator, vocab: int = VOCAB) -> torch.Tensor:
    """Random token ids above the special ids (0-3) and below ``vocab``."""
    return torch.randint(4, vocab, (1, length), generator=gen)


def _seq2seq_kwargs(vocab: int = VOCAB) -> dict[str, torch.Tensor]:
    gen = _generator()
    return {"input_ids": _ids(SEQ, gen, vocab),
            "attention_mask": torch.ones(1, SEQ, dtype=torch.int64),
            "decoder_input_ids": _ids(DECODER_SEQ, gen, vocab)}


def _pixels(size: int) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(1, 3, size, size, generator=_generator())}


def _audio(samples: int = 1600) -> dict[str, torch.Tensor]:
    """A tenth of a second of 16 kHz noise."""
    return {"input_values": torch.randn(1, samples, generator=_generator())}


# ---------------------------------------------------------------------------- encoder-decoders

# BART-style field names shared by BART, Marian and Pegasus.
_BART = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
             encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
             decoder_ffn_dim=64, max_position_embeddings=64, use_cache=False, **_TOKENS)


def t5():
    torch.manual_seed(0)
    config = hf.T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2,
                         num_heads=2, relative_attention_num_buckets=8, use_cache=False,
                         **_TOKENS)
    return unit_scaled(hf.T5ForConditionalGeneration(config).eval(), (), _seq2seq_kwargs())


def bart():
    torch.manual_seed(0)
    model = hf.BartForConditionalGeneration(hf.BartConfig(**_BART))
    return unit_scaled(model.eval(), (), _seq2seq_kwargs())


def marian():
    torch.manual_seed(0)
    # Sinusoidal positions, shared source/target vocabulary.
    model = hf.MarianMTModel(hf.MarianConfig(**_BART, decoder_vocab_size=VOCAB))
    return unit_scaled(model.eval(), (), _seq2seq_kwargs())


def pegasus():
    torch.manual_seed(0)
    model = hf.PegasusForConditionalGeneration(hf.PegasusConfig(**_BART))
    return unit_scaled(model.eval(), (), _seq2seq_kwargs())


def whisper():
    torch.manual_seed(0)
    # 16 mel bins x 32 frames; the encoder's two convolutions halve 32 frames to its 16
    # positions (Whisper insists on exactly 2 * max_source_positions input frames).
    config = hf.WhisperConfig(vocab_size=VOCAB, num_mel_bins=16, d_model=32,
                              encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                              decoder_attention_heads=2, encoder_ffn_dim=64,
                              decoder_ffn_dim=64, max_source_positions=16,
                              max_target_positions=32, use_cache=False, **_TOKENS)
    gen = _generator()
    kwargs = {"input_features": torch.randn(1, 16, 32, generator=gen),
              "decoder_input_ids": _ids(DECODER_SEQ, gen)}
    return unit_scaled(hf.WhisperForConditionalGeneration(config).eval(), (), kwargs)


# ---------------------------------------------------------------------------- dense prediction


def _tiny_resnet(**overrides) -> hf.ResNetConfig:
    return hf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                           layer_type="basic", **overrides)


def detr():
    torch.manual_seed(0)
    # An HF ResNet backbone (not timm), random weights; 8 object queries.
    config = hf.DetrConfig(use_timm_backbone=False, use_pretrained_backbone=False,
                           backbone_config=_tiny_resnet(out_features=["stage2"]),
                           d_model=32, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=2, decoder_attention_heads=2,
                           encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=8,
                           num_labels=10)
    return unit_scaled(hf.DetrForObjectDetection(config).eval(), (), _pixels(64))


def yolos():
    torch.manual_seed(0)
    # A plain ViT with 8 extra detection tokens.
    config = hf.YolosConfig(image_size=[32, 32], patch_size=8, hidden_size=32,
                            num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                            num_detection_tokens=8, num_labels=10)
    return unit_scaled(hf.YolosForObjectDetection(config).eval(), (), _pixels(32))


def segformer():
    torch.manual_seed(0)
    config = hf.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                                hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
                                num_attention_heads=[1, 2], mlp_ratios=[4, 4],
                                decoder_hidden_size=32, num_labels=10)
    return unit_scaled(hf.SegformerForSemanticSegmentation(config).eval(), (), _pixels(32))


def dpt():
    torch.manual_seed(0)
    # A 4-layer ViT (32 px, 8 px patches) whose four layers feed the reassemble/fusion neck.
    config = hf.DPTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=4,
                          num_attention_heads=2, intermediate_size=64,
                          backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[8, 16, 32, 32],
                          fusion_hidden_size=16)
    return unit_scaled(hf.DPTForDepthEstimation(config).eval(), (), _pixels(32))


def mobilevit_deeplabv3():
    torch.manual_seed(0)
    config = hf.MobileViTConfig(image_size=64, patch_size=2, hidden_sizes=[32, 48, 64],
                                neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                                num_attention_heads=2, aspp_out_channels=16, num_labels=10)
    return unit_scaled(hf.MobileViTForSemanticSegmentation(config).eval(), (), _pixels(64))


def mobilenetv2_deeplabv3():
    torch.manual_seed(0)
    config = hf.MobileNetV2Config(image_size=64, depth_multiplier=0.25, output_stride=8,
                                  num_labels=10)
    return unit_scaled(hf.MobileNetV2ForSemanticSegmentation(config).eval(), (), _pixels(64))


# ---------------------------------------------------------------------------- audio

# Two feature-extractor convolutions (stride 5 then 2: 1600 samples -> 159 frames) instead of
# seven, then a 2-layer transformer; a 32-letter CTC head.
_WAV2VEC2 = dict(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, conv_dim=[16, 16], conv_stride=[5, 2],
                 conv_kernel=[10, 3], num_feat_extract_layers=2, num_conv_pos_embeddings=16,
                 num_conv_pos_embedding_groups=2)


def wav2vec2():
    torch.manual_seed(0)
    return unit_scaled(hf.Wav2Vec2ForCTC(hf.Wav2Vec2Config(**_WAV2VEC2)).eval(), (), _audio())


def hubert():
    torch.manual_seed(0)
    return unit_scaled(hf.HubertForCTC(hf.HubertConfig(**_WAV2VEC2)).eval(), (), _audio())


def wavlm():
    torch.manual_seed(0)
    # Gated relative position bias, bucketed (32 buckets, max distance 64).
    config = hf.WavLMConfig(**_WAV2VEC2, num_buckets=32, max_bucket_distance=64)
    return unit_scaled(hf.WavLMForCTC(config).eval(), (), _audio())


def ast():
    torch.manual_seed(0)
    # Audio Spectrogram Transformer: a ViT over 32 frames x 16 mel bins, 16x16 patches at
    # stride 8 (3 x 1 patches).
    config = hf.ASTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=64, num_mel_bins=16, max_length=32,
                          frequency_stride=8, time_stride=8, num_labels=10)
    inputs = {"input_values": torch.randn(1, 32, 16, generator=_generator())}
    return unit_scaled(hf.ASTForAudioClassification(config).eval(), (), inputs)


# ---------------------------------------------------------------------------- image-text

_TEXT_TOWER = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=64, max_position_embeddings=32,
                   pad_token_id=0, bos_token_id=1, eos_token_id=2)
_VISION_TOWER = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=64)


def _image_text_kwargs() -> dict[str, torch.Tensor]:
    gen = _generator()
    return {"input_ids": _ids(SEQ, gen),
            "pixel_values": torch.randn(1, 3, 32, 32, generator=gen),
            "attention_mask": torch.ones(1, SEQ, dtype=torch.int64)}


def clip():
    torch.manual_seed(0)
    config = hf.CLIPConfig(text_config=_TEXT_TOWER, vision_config=_VISION_TOWER,
                           projection_dim=32)
    return unit_scaled(hf.CLIPModel(config).eval(), (), _image_text_kwargs())


def siglip():
    torch.manual_seed(0)
    config = hf.SiglipConfig(text_config=_TEXT_TOWER, vision_config=_VISION_TOWER)
    return unit_scaled(hf.SiglipModel(config).eval(), (), _image_text_kwargs())
