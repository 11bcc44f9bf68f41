"""Small models for the executorch target's int8 recipes (tests/targets/executorch/)."""

import torch


class ShiftedLookup(torch.nn.Module):
    """Integer maths with scalars on a runtime tensor before it indexes a table, as Hugging
    Face's attention mask computes ``arange(n) + offset`` and indexes with it."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(48, 16)
        self.out = torch.nn.Linear(16, 8)

    def forward(self, ids):
        return self.out(self.table(ids * 2 + 1))


def shifted_lookup():
    torch.manual_seed(0)
    return ShiftedLookup().eval(), (torch.randint(0, 20, (2, 6)),)
