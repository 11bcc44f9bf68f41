"""A small EfficientNet-shaped CNN for int8-static tests (tests/targets/onnx/): a conv +
batch norm + SiLU stem, two inverted-residual blocks (depthwise conv, squeeze-excite,
projection), a SiLU head, and a ceil-mode ``AvgPool2d`` whose last windows run past the
map, as transformers' EfficientNet pools (its window spans the whole map, which becomes a
mean before export: passes/cleanup/global_pool.py; this one stays a pool). Convolutions
He-initialised and batch norms calibrated on random images, as bench/models.py's
``_calibrated`` leaves the bench CNNs."""

import torch
from torch import nn

WIDTH = 64  # the head's channels


def _conv_bn(cin: int, cout: int, kernel: int = 1, stride: int = 1, groups: int = 1,
             act: bool = True) -> nn.Sequential:
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.SiLU()) if act else nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduced: int):
        super().__init__()
        self.reduce = nn.Conv2d(channels, reduced, 1)
        self.expand = nn.Conv2d(reduced, channels, 1)

    def forward(self, x):
        scale = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.expand(nn.functional.silu(self.reduce(scale))))


class Block(nn.Module):
    """Expand, depthwise, squeeze-excite, project; a residual where the shapes allow."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4):
        super().__init__()
        hidden = cin * expand
        self.expand = _conv_bn(cin, hidden)
        self.depthwise = _conv_bn(hidden, hidden, 3, stride, groups=hidden)
        self.excite = SqueezeExcite(hidden, max(1, cin // 4))
        self.project = _conv_bn(hidden, cout, act=False)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.project(self.excite(self.depthwise(self.expand(x))))
        return x + y if self.residual else y


class TinyEfficientNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = _conv_bn(3, 16, 3, 2)
        self.blocks = nn.Sequential(Block(16, 24, 2), Block(24, 24, 1))
        self.head = _conv_bn(24, WIDTH)
        self.pool = nn.AvgPool2d(3, ceil_mode=True)  # 8x8 -> 3x3, the last windows 2 wide
        self.classifier = nn.Linear(WIDTH * 9, classes)

    def forward(self, x):
        return self.classifier(self.pool(self.head(self.blocks(self.stem(x)))).flatten(1))


@torch.no_grad()
def factory():
    torch.manual_seed(0)
    model = TinyEfficientNet()
    for conv in (m for m in model.modules() if isinstance(m, nn.Conv2d)):
        nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
    for norm in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
        norm.momentum = None  # a cumulative average over the batches below
    model.train()
    for _ in range(2):
        model(torch.randn(8, 3, 32, 32))
    return model.eval(), (torch.randn(1, 3, 32, 32),)
