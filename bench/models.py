"""Full-size models for the benchmark suite, batch 1, random weights (no downloads).

torchvision and transformers definitions where installed (the GPU machine has
both); a model whose package is missing raises ImportError and the suite skips it.
"""

from __future__ import annotations

import torch


def _seeded() -> None:
    torch.manual_seed(0)


def resnet50():
    import torchvision
    _seeded()
    return torchvision.models.resnet50(weights=None).eval(), (torch.randn(1, 3, 224, 224),)


def mobilenet_v3_large():
    import torchvision
    _seeded()
    return (torchvision.models.mobilenet_v3_large(weights=None).eval(),
            (torch.randn(1, 3, 224, 224),))


def vit_b_16():
    import torchvision
    _seeded()
    return torchvision.models.vit_b_16(weights=None).eval(), (torch.randn(1, 3, 224, 224),)


def bert_base():
    from transformers import BertConfig, BertModel
    _seeded()
    model = BertModel(BertConfig()).eval()  # BERT-base: 12 layers, hidden 768
    ids = torch.randint(0, 30522, (1, 128))
    return model, (ids, torch.ones(1, 128, dtype=torch.int64))


def gpt2_small():
    from transformers import GPT2Config, GPT2LMHeadModel
    _seeded()
    model = GPT2LMHeadModel(GPT2Config(use_cache=False)).eval()  # GPT-2 small: 124M
    return model, (torch.randint(0, 50257, (1, 128)),)


def gpt2_small_next_token():
    """GPT-2 small on one token: every weight read for a few FLOPs, the memory-bound
    regime of decoding (no KV cache here; weight-only quantization is aimed at it)."""
    model, (ids,) = gpt2_small()
    return model, (ids[:, :1],)


def convnext_tiny():
    import torchvision
    _seeded()
    return (torchvision.models.convnext_tiny(weights=None).eval(),
            (torch.randn(1, 3, 224, 224),))


def deit_small():
    """timm's DeiT-S (patch 16, 224), random weights."""
    import timm
    _seeded()
    return (timm.create_model("deit_small_patch16_224", pretrained=False).eval(),
            (torch.randn(1, 3, 224, 224),))


def _image(model):  # ImageNet heads (1000 labels), one 224x224 image
    return model.eval(), (torch.randn(1, 3, 224, 224),)


def hf_mobilenet_v2():
    """transformers' MobileNetV2 (1.0, 224: its config's defaults), random weights."""
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification
    _seeded()
    return _image(MobileNetV2ForImageClassification(MobileNetV2Config(num_labels=1000)))


def hf_resnet50():
    """transformers' ResNet with its config's defaults, which are ResNet-50's."""
    from transformers import ResNetConfig, ResNetForImageClassification
    _seeded()
    return _image(ResNetForImageClassification(ResNetConfig(num_labels=1000)))


def hf_efficientnet_b0():
    """transformers' EfficientNet at B0's coefficients (the config's defaults are B7's)."""
    from transformers import EfficientNetConfig, EfficientNetForImageClassification
    _seeded()
    config = EfficientNetConfig(width_coefficient=1.0, depth_coefficient=1.0, image_size=224,
                                dropout_rate=0.2, hidden_dim=1280, num_labels=1000)
    return _image(EfficientNetForImageClassification(config))


def hf_vit_b_16():
    """transformers' ViT with its config's defaults: ViT-B/16 at 224."""
    from transformers import ViTConfig, ViTForImageClassification
    _seeded()
    return _image(ViTForImageClassification(ViTConfig(num_labels=1000)))


SUITE = {
    "zoo-mlp": "zoo:mlp", "zoo-cnn": "zoo:cnn", "zoo-encoder": "zoo:encoder",
    "zoo-decoder": "zoo:decoder",
    "resnet50": "bench/models.py:resnet50",
    "mobilenet_v3_large": "bench/models.py:mobilenet_v3_large",
    "vit_b_16": "bench/models.py:vit_b_16",
    "deit_small": "bench/models.py:deit_small",
    "convnext_tiny": "bench/models.py:convnext_tiny",
    "bert_base": "bench/models.py:bert_base",
    "gpt2_small": "bench/models.py:gpt2_small",
}
