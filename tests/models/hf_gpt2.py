"""A GPT-2-style decoder from a small transformers config (random weights, no download).
Its attention-mask handling takes a cumsum over a bool mask, which TVM's importer
types as bool where PyTorch gives int64 (the `tvm` target's known failure)."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel


class LogitsOnly(torch.nn.Module):
    """GPT-2's second positional argument is past_key_values: pass the mask by name."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def tiny_gpt2():
    config = GPT2Config(vocab_size=128, bos_token_id=0, eos_token_id=0, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                        use_cache=False)
    torch.manual_seed(0)
    model = LogitsOnly(GPT2LMHeadModel(config)).eval()
    input_ids = torch.randint(0, 128, (1, 16))
    attention_mask = torch.ones(1, 16, dtype=torch.int64)
    return model, (input_ids, attention_mask)
