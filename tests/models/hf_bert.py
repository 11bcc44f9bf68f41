"""A model defined outside the repo, as a new user would bring it: a Hugging Face BERT
built from a small config (random weights, no download)."""

import torch
from transformers import BertConfig, BertModel


def tiny_bert():
    config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    model = BertModel(config).eval()
    input_ids = torch.randint(0, 128, (2, 12))
    attention_mask = torch.ones(2, 12, dtype=torch.int64)
    return model, (input_ids, attention_mask)


class LastHiddenState(torch.nn.Module):
    """The caller keeps only last_hidden_state: the pooler becomes dead code in the graph
    (torchao's prepare_pt2e failed on it with a bare IndexError before cleanup)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def tiny_bert_last_hidden_state():
    model, args = tiny_bert()
    return LastHiddenState(model).eval(), args
