"""Vision models from Hugging Face transformers: CNNs, conv/attention hybrids and ViTs.

Each factory builds the real transformers class (``...ForImageClassification`` where one
exists) from a config object with random weights (unit-scaled: unit_scale.py), batch 1,
and returns ``(model, (), {"pixel_values": x})``. No downloads and no torchvision.

Configs are tiny on purpose (2 stages or 2 layers, 16-64 channels, 32-64 px images):
the suite is about operator and graph-pattern coverage across architectures, and every
model has to export and compile in seconds on a 2-core machine. Nothing here is meant
to be accurate or representative in size.
"""

from __future__ import annotations

import torch
import transformers as hf

try:  # a spec file: `exporter build` puts its folder on sys.path, so this folder's own
    from unit_scale import unit_scaled
except ImportError:  # imported as bench.coverage.<file>
    from bench.coverage.unit_scale import unit_scaled

_LABELS = 10  # a small classifier head keeps parameter counts down


def _pixels(size: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {"pixel_values": torch.randn(1, 3, size, size, generator=gen)}


def _classifier(model_cls, config, size: int):
    """The model in eval mode with its example kwargs, unit-scaled (unit_scale.py); the
    caller has seeded torch."""
    return unit_scaled(model_cls(config).eval(), (), _pixels(size))


# ---------------------------------------------------------------------------- CNNs


def resnet():
    torch.manual_seed(0)
    config = hf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                             layer_type="bottleneck", num_labels=_LABELS)
    return _classifier(hf.ResNetForImageClassification, config, 32)


def mobilenet_v1():
    torch.manual_seed(0)
    config = hf.MobileNetV1Config(image_size=32, depth_multiplier=0.25, num_labels=_LABELS)
    return _classifier(hf.MobileNetV1ForImageClassification, config, 32)


def mobilenet_v2():
    torch.manual_seed(0)
    config = hf.MobileNetV2Config(image_size=32, depth_multiplier=0.25, num_labels=_LABELS)
    return _classifier(hf.MobileNetV2ForImageClassification, config, 32)


def efficientnet():
    torch.manual_seed(0)
    # Three MBConv stages instead of seven. hidden_dim must equal round_filters(1280),
    # which is 320 at width 0.25.
    config = hf.EfficientNetConfig(
        image_size=32, width_coefficient=0.25, depth_coefficient=1.0,
        kernel_sizes=[3, 3, 5], in_channels=[32, 16, 24], out_channels=[16, 24, 40],
        strides=[1, 2, 2], num_block_repeats=[1, 1, 1], expand_ratios=[1, 6, 6],
        depthwise_padding=[], hidden_dim=320, num_labels=_LABELS)
    return _classifier(hf.EfficientNetForImageClassification, config, 32)


def convnext():
    torch.manual_seed(0)
    config = hf.ConvNextConfig(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1],
                               image_size=32, num_labels=_LABELS)
    return _classifier(hf.ConvNextForImageClassification, config, 32)


def convnextv2():
    torch.manual_seed(0)
    config = hf.ConvNextV2Config(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1],
                                 image_size=32, num_labels=_LABELS)
    return _classifier(hf.ConvNextV2ForImageClassification, config, 32)


def regnet():
    torch.manual_seed(0)
    config = hf.RegNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                             groups_width=8, layer_type="y", num_labels=_LABELS)
    return _classifier(hf.RegNetForImageClassification, config, 32)


def bit():
    torch.manual_seed(0)
    # BiT: pre-activation ResNet with weight-standardized convs and group norm.
    config = hf.BitConfig(embedding_size=16, hidden_sizes=[32, 64], depths=[1, 1],
                          num_groups=8, layer_type="preactivation", num_labels=_LABELS,
                          out_features=["stage2"])
    return _classifier(hf.BitForImageClassification, config, 32)


# ---------------------------------------------------------------------------- hybrids


def mobilevit():
    torch.manual_seed(0)
    config = hf.MobileViTConfig(image_size=64, patch_size=2, hidden_sizes=[32, 48, 64],
                                neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                                num_attention_heads=2, num_labels=_LABELS)
    return _classifier(hf.MobileViTForImageClassification, config, 64)


def mobilevitv2():
    torch.manual_seed(0)
    config = hf.MobileViTV2Config(image_size=64, patch_size=2, width_multiplier=0.25,
                                  n_attn_blocks=[1, 1, 1], num_labels=_LABELS)
    return _classifier(hf.MobileViTV2ForImageClassification, config, 64)


def levit():
    torch.manual_seed(0)
    # down_ops: [name, key_dim, num_heads (= hidden_sizes[i] // key_dim), attention_ratio,
    # mlp_ratio, stride], one between each pair of stages.
    config = hf.LevitConfig(image_size=64, patch_size=16, hidden_sizes=[32, 64],
                            num_attention_heads=[2, 4], depths=[1, 1], key_dim=[8, 8],
                            mlp_ratio=[2, 2], attention_ratio=[2, 2],
                            down_ops=[["Subsample", 8, 4, 4, 2, 2]], num_labels=_LABELS)
    return _classifier(hf.LevitForImageClassification, config, 64)


def swiftformer():
    torch.manual_seed(0)
    # SwiftFormer stands in for EfficientFormer, which transformers 5 removed.
    config = hf.SwiftFormerConfig(image_size=32, depths=[1, 1], embed_dims=[16, 32],
                                  downsamples=[True, True], num_labels=_LABELS)
    return _classifier(hf.SwiftFormerForImageClassification, config, 32)


def poolformer():
    torch.manual_seed(0)
    config = hf.PoolFormerConfig(num_encoder_blocks=2, depths=[1, 1], hidden_sizes=[16, 32],
                                 patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1],
                                 num_labels=_LABELS)
    return _classifier(hf.PoolFormerForImageClassification, config, 32)


def cvt():
    torch.manual_seed(0)
    two = lambda a, b: [a, b]  # noqa: E731 - every CvT option is one value per stage
    # depth[i] must be > i: CvtStage indexes its per-layer drop-path list by stage number.
    config = hf.CvtConfig(
        patch_sizes=two(7, 3), patch_stride=two(4, 2), patch_padding=two(2, 1),
        embed_dim=two(16, 32), num_heads=two(1, 2), depth=two(1, 2),
        mlp_ratio=two(4.0, 4.0), attention_drop_rate=two(0.0, 0.0), drop_rate=two(0.0, 0.0),
        drop_path_rate=two(0.0, 0.0), qkv_bias=two(True, True), cls_token=two(False, True),
        qkv_projection_method=two("dw_bn", "dw_bn"), kernel_qkv=two(3, 3),
        padding_kv=two(1, 1), stride_kv=two(2, 2), padding_q=two(1, 1), stride_q=two(1, 1),
        num_labels=_LABELS)
    return _classifier(hf.CvtForImageClassification, config, 32)


def focalnet():
    torch.manual_seed(0)
    config = hf.FocalNetConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                               hidden_sizes=[16, 32], focal_levels=[2, 2],
                               focal_windows=[3, 3], drop_path_rate=0.0, num_labels=_LABELS)
    return _classifier(hf.FocalNetForImageClassification, config, 32)


# ---------------------------------------------------------------------------- ViTs

# One plain-ViT shape for ViT, DeiT, BEiT and DINOv2: 32 px, 8 px patches (16 tokens).
_VIT = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=64, num_labels=_LABELS)


def vit():
    torch.manual_seed(0)
    return _classifier(hf.ViTForImageClassification, hf.ViTConfig(**_VIT), 32)


def deit():
    torch.manual_seed(0)
    return _classifier(hf.DeiTForImageClassification, hf.DeiTConfig(**_VIT), 32)


def beit():
    torch.manual_seed(0)
    config = hf.BeitConfig(**_VIT, use_relative_position_bias=True, use_mean_pooling=True)
    return _classifier(hf.BeitForImageClassification, config, 32)


def dinov2():
    torch.manual_seed(0)
    return _classifier(hf.Dinov2ForImageClassification, hf.Dinov2Config(**_VIT), 32)


def swin():
    torch.manual_seed(0)
    config = hf.SwinConfig(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1],
                           num_heads=[2, 2], window_size=4, drop_path_rate=0.0,
                           num_labels=_LABELS)
    return _classifier(hf.SwinForImageClassification, config, 32)


def swinv2():
    torch.manual_seed(0)
    config = hf.Swinv2Config(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1],
                             num_heads=[2, 2], window_size=4, drop_path_rate=0.0,
                             pretrained_window_sizes=[0, 0], num_labels=_LABELS)
    return _classifier(hf.Swinv2ForImageClassification, config, 32)


def pvt_v2():
    torch.manual_seed(0)
    config = hf.PvtV2Config(image_size=32, num_encoder_blocks=2, depths=[1, 1],
                            sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3],
                            strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[4, 4],
                            num_labels=_LABELS)
    return _classifier(hf.PvtV2ForImageClassification, config, 32)


def hiera():
    torch.manual_seed(0)
    # 64 px / stride 4 = 16x16 tokens in 8x8 mask units; one query-pooling step (2 stages).
    config = hf.HieraConfig(image_size=[64, 64], embed_dim=16, depths=[1, 1], num_heads=[1, 2],
                            num_query_pool=1, masked_unit_attention=[True, False],
                            num_labels=_LABELS)
    return _classifier(hf.HieraForImageClassification, config, 64)
