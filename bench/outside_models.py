"""Models of an outside check: small random-initialised transformers architectures that
bench/coverage does not build (XLNet, Nystromformer, BigBird, CANINE, VitDet, UperNet over
ConvNeXt, SEW, Data2VecAudio, UniSpeech, RT-DETR), as `exporter build` factories, and
decoder checkpoints for `--task text-generation` (Granite, OLMo, GLM, Nemotron).

    exporter build bench/outside_models.py:xlnet --target onnx
    python -m bench.outside_models CHECKPOINTS_DIR   # granite/, olmo/, glm/, nemotron/, and
                                                     # the encoders saved for hf: specs
Plain random initialisation, as a user's trial would do it (no unit scaling): RT-DETR's
encoder output then collapses to ~1e-13 and its top-k runs over ties.
"""
import torch
import transformers as hf

V, S = 256, 16


def _text(seq=S, vocab=V):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab, (1, seq), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones(1, seq, dtype=torch.int64)}


def _img(size=64, ch=3):
    g = torch.Generator().manual_seed(0)
    return {"pixel_values": torch.randn(1, ch, size, size, generator=g)}


def _audio(n=1600):
    g = torch.Generator().manual_seed(0)
    return {"input_values": torch.randn(1, n, generator=g)}


def xlnet():
    torch.manual_seed(0)
    c = hf.XLNetConfig(vocab_size=V, d_model=32, n_layer=2, n_head=2, d_inner=64, num_labels=5)
    return hf.XLNetForSequenceClassification(c).eval(), (), _text()


def nystromformer():
    torch.manual_seed(0)
    c = hf.NystromformerConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=2, intermediate_size=64,
                               max_position_embeddings=70, num_landmarks=4, segment_means_seq_len=S, num_labels=5)
    return hf.NystromformerForSequenceClassification(c).eval(), (), _text()


def bigbird():
    torch.manual_seed(0)
    c = hf.BigBirdConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64,
                         attention_type="original_full", num_labels=5)
    return hf.BigBirdForSequenceClassification(c).eval(), (), _text()


def canine():
    torch.manual_seed(0)
    c = hf.CanineConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, num_hash_functions=4,
                        num_hash_buckets=64, downsampling_rate=4, local_transformer_stride=16,
                        num_labels=5)
    return hf.CanineForSequenceClassification(c).eval(), (), _text(32, 1000)


def vitdet():
    torch.manual_seed(0)
    c = hf.VitDetConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2,
                        image_size=64, pretrain_image_size=64, patch_size=8,
                        window_block_indices=[0], window_size=4, use_relative_position_embeddings=True)
    return hf.VitDetModel(c).eval(), (), _img(64)


def upernet_convnext():
    torch.manual_seed(0)
    bb = hf.ConvNextConfig(num_channels=3, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1],
                           out_features=["stage1", "stage2", "stage3", "stage4"])
    c = hf.UperNetConfig(backbone_config=bb, hidden_size=32, auxiliary_channels=16,
                         num_labels=4, use_auxiliary_head=False)
    return hf.UperNetForSemanticSegmentation(c).eval(), (), _img(64)


_W2V = dict(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, conv_dim=[16, 16], conv_stride=[5, 2], conv_kernel=[10, 3],
            num_feat_extract_layers=2, num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=2)


def sew():
    torch.manual_seed(0)
    c = hf.SEWConfig(**_W2V, squeeze_factor=2)
    return hf.SEWForCTC(c).eval(), (), _audio()


def data2vec_audio():
    torch.manual_seed(0)
    c = hf.Data2VecAudioConfig(**_W2V, num_labels=5)
    return hf.Data2VecAudioForSequenceClassification(c).eval(), (), _audio()


def unispeech():
    torch.manual_seed(0)
    c = hf.UniSpeechConfig(**_W2V)
    return hf.UniSpeechForCTC(c).eval(), (), _audio()


def rtdetr():
    torch.manual_seed(0)
    c = hf.RTDetrConfig(
        backbone_config=hf.RTDetrResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128],
                                              depths=[1, 1, 1, 1], layer_type="basic",
                                              out_features=["stage2", "stage3", "stage4"]),
        encoder_hidden_dim=32, encoder_in_channels=[32, 64, 128], d_model=32,
        encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=20, decoder_layers=2,
        decoder_attention_heads=2, encoder_attention_heads=2, num_labels=4,
        num_denoising=0, decoder_in_channels=[32, 32, 32], num_feature_levels=3)
    return hf.RTDetrForObjectDetection(c).eval(), (), _img(64)


_DECODER = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
# each family's own features: Granite's multipliers, OLMo's clipped QKV, partial rotary
_DECODERS = {
    "granite": ("GraniteConfig", dict(embedding_multiplier=12.0, attention_multiplier=0.1,
                                      residual_multiplier=0.22, logits_scaling=8.0)),
    "olmo": ("OlmoConfig", dict(clip_qkv=8.0)),
    "glm": ("GlmConfig", dict(head_dim=16, partial_rotary_factor=0.5)),
    "nemotron": ("NemotronConfig", dict(head_dim=16, partial_rotary_factor=0.5)),
}
_ENCODERS = ("xlnet", "bigbird", "canine", "vitdet", "sew", "data2vec_audio", "upernet_convnext")


def write_checkpoints(folder) -> None:
    """Decoders (lm_head x20: random logits are near-uniform and greedy ties flip) and
    the encoders, saved with save_pretrained for hf: specs."""
    from pathlib import Path
    for name, (config, extra) in _DECODERS.items():
        torch.manual_seed(0)
        model = hf.AutoModelForCausalLM.from_config(getattr(hf, config)(**_DECODER, **extra))
        with torch.no_grad():
            model.lm_head.weight.mul_(20)
        model.eval().save_pretrained(Path(folder) / name)
    for name in _ENCODERS:
        model = globals()[name]()[0]
        model.config.architectures = [type(model).__name__]
        model.save_pretrained(Path(folder) / name)


if __name__ == "__main__":
    import sys
    write_checkpoints(sys.argv[1])
