"""Small edge-style models from Hugging Face configs with random weights (no download):
a MobileNetV2-style CNN, a BERT-style encoder and a LLaMA-style decoder's forward pass (the
logits of one sequence, not generation)."""

from __future__ import annotations

import torch

from tests.models.hf_bert import tiny_bert_last_hidden_state


class Logits(torch.nn.Module):
    """A model's logits alone, from its first output (HF models return a ModelOutput)."""

    def __init__(self, model: torch.nn.Module, key: str = "logits") -> None:
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(x), self.key)


def mobilenet_v2():
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification
    config = MobileNetV2Config(num_channels=3, image_size=32, depth_multiplier=0.25,
                               num_labels=10)
    torch.manual_seed(0)
    model = MobileNetV2ForImageClassification(config).eval()
    return Logits(model).eval(), (torch.randn(1, 3, 32, 32),)


def bert():
    return tiny_bert_last_hidden_state()


def llama_forward():
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, use_cache=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    return Logits(model).eval(), (torch.randint(0, 128, (1, 16)),)
