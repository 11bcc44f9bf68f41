"""bench/cuda_gap.py's models: the suite's (bench/models.py) and architectures the suite
does not tune for, so a cuda change is judged on models it was not written against
(issue 52 checks on models outside the repository). Batch 1, random weights, no downloads;
torchvision, timm and transformers as installed on the GPU machine. Any other timm or
torchvision image model is named ``timm__NAME`` or ``tv__NAME`` (``model_spec``): a
held-back model is timed without a factory written for it here."""

from __future__ import annotations

import torch

from bench.models import SUITE


def _image(model):  # one 224x224 image
    torch.manual_seed(0)
    return model.eval(), (torch.randn(1, 3, 224, 224),)


def _timm(name: str):
    import timm
    torch.manual_seed(0)
    return _image(timm.create_model(name, pretrained=False))


def _torchvision(name: str):
    import torchvision
    torch.manual_seed(0)
    return _image(getattr(torchvision.models, name)(weights=None))


def efficientnet_b0():
    """timm's EfficientNet-B0: depthwise convolutions and squeeze-excite."""
    return _timm("efficientnet_b0")


def swin_tiny():
    """timm's Swin-T: shifted-window attention."""
    return _timm("swin_tiny_patch4_window7_224")


def resnext50():
    """torchvision's ResNeXt-50 32x4d: group convolutions of 4-32 channels a group."""
    return _torchvision("resnext50_32x4d")


def mobilenet_v2():
    return _torchvision("mobilenet_v2")


def shufflenet_v2():
    """torchvision's ShuffleNetV2 x1.0: channel shuffles and depthwise convolutions."""
    return _torchvision("shufflenet_v2_x1_0")


def densenet121():
    """torchvision's DenseNet-121: concatenations feeding every convolution."""
    return _torchvision("densenet121")


def distilbert():
    """transformers' DistilBERT (its config's defaults: 6 layers, hidden 768), 128 tokens."""
    from transformers import DistilBertConfig, DistilBertModel
    torch.manual_seed(0)
    model = DistilBertModel(DistilBertConfig()).eval()
    return model, (torch.randint(0, 30522, (1, 128)), torch.ones(1, 128, dtype=torch.int64))


def __getattr__(name: str):
    """``timm__NAME`` / ``tv__NAME``: a factory for that timm / torchvision model."""
    source, _, model = name.partition("__")
    if model and source in _BY_NAME:
        return lambda: _BY_NAME[source](model)
    raise AttributeError(name)


_BY_NAME = {"timm": _timm, "tv": _torchvision}


def model_spec(name: str) -> str:
    """The spec of a suite model, or of a ``timm__NAME`` / ``tv__NAME`` model."""
    if name in CUDA_SUITE:
        return CUDA_SUITE[name]
    if name.partition("__")[0] in _BY_NAME:
        return f"bench/cuda_models.py:{name}"
    raise KeyError(f"{name}: not in the suite and not timm__NAME or tv__NAME")


CUDA_SUITE = {**SUITE, **{name: f"bench/cuda_models.py:{name}" for name in (
    "efficientnet_b0", "swin_tiny", "resnext50", "mobilenet_v2", "shufflenet_v2",
    "densenet121", "distilbert")}}
