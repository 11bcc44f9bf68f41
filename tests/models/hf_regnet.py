"""A Hugging Face RegNetY image classifier from a small config (random weights, no
download): depthwise convolutions (groups_width 1), squeeze-excite and residual adds in
two one-block stages, 33 ops where tests/models/hf_mobilenet.py's MobileNetV2 has 152."""

import torch
from transformers import RegNetConfig, RegNetForImageClassification

from tests.models.hf_mobilenet import Logits, he_initialized


def tiny_regnet_y():
    config = RegNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                          groups_width=1, layer_type="y", num_labels=10)
    torch.manual_seed(0)
    model = he_initialized(RegNetForImageClassification(config).eval())
    return Logits(model).eval(), (torch.randn(2, 3, 32, 32),)
