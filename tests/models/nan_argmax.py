"""A model on which one backend really parts from eager: ``torch.argmax`` ranks NaN above
every number, ONNX Runtime's ArgMax skips it. The log makes NaN wherever the input is
negative. A custom op between the two linears puts a CPU-fallback partition in the middle,
so the onnx build has three partitions (ORT, torch, ORT) and only the last one diverges."""

import torch


@torch.library.custom_op("edgetest::halve", mutates_args=())
def halve(x: torch.Tensor) -> torch.Tensor:
    return x * 0.5


@halve.register_fake
def _(x):
    return torch.empty_like(x)


class NanArgmax(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(6, 6)
        self.second = torch.nn.Linear(6, 6)

    def forward(self, x):
        hidden = halve(torch.relu(self.first(x)))
        scores = torch.log(self.second(hidden))  # NaN where negative
        return torch.argmax(scores, dim=-1)


def factory():
    torch.manual_seed(0)
    return NanArgmax().eval(), (torch.randn(4, 6),)
