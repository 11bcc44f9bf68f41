"""A Hugging Face MobileNetV2 image classifier from a small config (random weights, no
download), as a new user would bring it."""

import torch
from transformers import MobileNetV2Config, MobileNetV2ForImageClassification


class Logits(torch.nn.Module):
    """The caller keeps only the logits (the output's other fields are None)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).logits


def he_initialized(model: torch.nn.Module) -> torch.nn.Module:
    """He init instead of the config's 0.02: outputs of order 1 (0.02 leaves logits ~1e-30)."""
    for module in model.modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            torch.nn.init.kaiming_normal_(module.weight)
    return model


def tiny_mobilenet_v2():
    config = MobileNetV2Config(image_size=32, depth_multiplier=0.35, num_labels=10,
                               min_depth=8)
    torch.manual_seed(0)
    model = he_initialized(MobileNetV2ForImageClassification(config).eval())
    return Logits(model).eval(), (torch.randn(2, 3, 32, 32),)
