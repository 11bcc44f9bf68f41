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


def mixer_b16():
    """timm's MLP-Mixer-B/16 at 224, random weights."""
    import timm
    _seeded()
    return _image(timm.create_model("mixer_b16_224", pretrained=False))


def regnety_016():
    """timm's RegNetY-1.6GF (group convolutions, squeeze-excite), random weights."""
    import timm
    _seeded()
    return _image(timm.create_model("regnety_016", pretrained=False))


def _image(model):  # ImageNet heads (1000 labels), one 224x224 image
    return model.eval(), (torch.randn(1, 3, 224, 224),)


@torch.no_grad()
def _calibrated(model, batches: int = 2):
    """Convolutions initialised to keep their activations' variance (He), batch norms at
    torch's defaults (scale 1) with running statistics from random images, as training
    would leave them: with transformers' std-0.02 initialisation (batch norm scales
    included) MobileNetV2's logits shrink to 1e-21 and EfficientNet's pass through fp32
    denormals to exact zeros, which times denormal arithmetic and leaves int8 nothing to
    quantize."""
    for conv in (m for m in model.modules() if isinstance(m, torch.nn.Conv2d)):
        torch.nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_parameters()  # scale 1, shift 0, fresh statistics
        norm.momentum = None  # a cumulative average over the batches below
    model.train()
    for _ in range(batches):
        model(torch.randn(8, 3, 224, 224))
    return model


def hf_mobilenet_v2():
    """transformers' MobileNetV2 (1.0, 224: its config's defaults), random weights,
    convolutions He-initialised and batch norms calibrated (``_calibrated``)."""
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification
    _seeded()
    model = MobileNetV2ForImageClassification(MobileNetV2Config(num_labels=1000))
    return _image(_calibrated(model))


def hf_resnet50():
    """transformers' ResNet with its config's defaults, which are ResNet-50's."""
    from transformers import ResNetConfig, ResNetForImageClassification
    _seeded()
    return _image(ResNetForImageClassification(ResNetConfig(num_labels=1000)))


def hf_efficientnet_b0():
    """transformers' EfficientNet at B0's coefficients (the config's defaults are B7's),
    convolutions He-initialised and batch norms calibrated (``_calibrated``)."""
    from transformers import EfficientNetConfig, EfficientNetForImageClassification
    _seeded()
    config = EfficientNetConfig(width_coefficient=1.0, depth_coefficient=1.0, image_size=224,
                                dropout_rate=0.2, hidden_dim=1280, num_labels=1000)
    return _image(_calibrated(EfficientNetForImageClassification(config)))


def hf_vit_b_16():
    """transformers' ViT with its config's defaults: ViT-B/16 at 224."""
    from transformers import ViTConfig, ViTForImageClassification
    _seeded()
    return _image(ViTForImageClassification(ViTConfig(num_labels=1000)))


def hf_convnext_tiny():
    """transformers' ConvNeXt with its config's defaults, which are ConvNeXt-T's (no
    torchvision needed)."""
    from transformers import ConvNextConfig, ConvNextForImageClassification
    _seeded()
    return _image(ConvNextForImageClassification(ConvNextConfig(num_labels=1000)))


SUITE = {
    "zoo-mlp": "zoo:mlp", "zoo-cnn": "zoo:cnn", "zoo-encoder": "zoo:encoder",
    "zoo-decoder": "zoo:decoder",
    "resnet50": "bench/models.py:resnet50",
    "mobilenet_v3_large": "bench/models.py:mobilenet_v3_large",
    "vit_b_16": "bench/models.py:vit_b_16",
    "deit_small": "bench/models.py:deit_small",
    "mixer_b16": "bench/models.py:mixer_b16",
    "regnety_016": "bench/models.py:regnety_016",
    "convnext_tiny": "bench/models.py:convnext_tiny",
    "bert_base": "bench/models.py:bert_base",
    "gpt2_small": "bench/models.py:gpt2_small",
}
