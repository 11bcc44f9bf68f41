"""A model whose eager behaviour depends on Python state that capture bakes in:
each call scales by a counter. The artifact keeps the value seen at capture, so
validation must catch the mismatch."""

import torch


class CountingScale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.linear(x) * self.calls


def counting():
    torch.manual_seed(0)
    return CountingScale().eval(), (torch.randn(2, 8),)


def data_dependent():
    class Branchy(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x - 1

    return Branchy(), (torch.randn(2, 3),)
