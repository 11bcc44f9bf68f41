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


class ConvHead(torch.nn.Module):
    """A padded convolution without an activation after it (Hugging Face MobileNetV2's
    TensorFlow-style padding), then a linear head: XNNPACKQuantizer's dynamic recipe
    annotates both kinds."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, image):
        padded = torch.nn.functional.pad(image, (0, 1, 0, 1))
        return self.head(self.conv(padded).mean((2, 3)))


def conv_head():
    torch.manual_seed(0)
    return ConvHead().eval(), (torch.randn(2, 3, 9, 9),)
