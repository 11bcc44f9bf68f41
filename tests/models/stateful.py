"""Models that go wrong in the ways users meet.

``export_differs``: takes another code path under torch.export than in eager
(as models with ``is_exporting()``/``is_compiling()`` branches do), so the
artifact computes something else and validation must catch it.
``data_dependent``: branches on a tensor's value, which torch.export cannot capture.
"""

import torch


class ExportDiffers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.linear(x)
        if torch.compiler.is_exporting():
            return y * 1.01  # e.g. a "fast path" that is subtly different
        return y


def export_differs():
    torch.manual_seed(0)
    return ExportDiffers().eval(), (torch.randn(2, 8),)


def data_dependent():
    class Branchy(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x - 1

    return Branchy(), (torch.randn(2, 3),)
