"""torchvision and timm image models, random weights (``weights=None`` / ``pretrained=False``).

These need torchvision (timm imports it too), which is not installed on the CPU
development machine, so they run on the GPU machine only (``needs="torchvision"`` in
suite.py). Each factory imports its library inside the function, so this module imports
anywhere; each returns ``(model, (x,), {})`` with one image batch of 1.

The architectures are the libraries' own, unshrunk (these builders take no width or depth
knobs beyond a few); only the classifier is cut to 10 classes and the input kept small
where the architecture allows: 64 px for fully convolutional nets, 96 px for Inception
v3 (at least 75), 128 px for LeViT and MaxViT (built for that size through ``img_size``,
which sizes their attention biases and windows), and 224 px for EfficientFormer, whose
attention biases are fixed to a 7x7 grid.
"""

from __future__ import annotations

import torch

CLASSES = 10


def _image(size: int) -> torch.Tensor:
    return torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))


def _timm(name: str, size: int, **kwargs):
    import timm

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=CLASSES, **kwargs)
    return model.eval(), (_image(size),), {}


# ---------------------------------------------------------------------------- torchvision


def tv_resnet18():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=CLASSES)
    return model.eval(), (_image(64),), {}


def tv_mobilenet_v3_small():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(weights=None, num_classes=CLASSES)
    return model.eval(), (_image(64),), {}


def tv_shufflenet_v2_x0_5():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.shufflenet_v2_x0_5(weights=None, num_classes=CLASSES)
    return model.eval(), (_image(64),), {}


def tv_densenet121():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.densenet121(weights=None, num_classes=CLASSES)
    return model.eval(), (_image(64),), {}


def tv_inception_v3():
    import torchvision

    torch.manual_seed(0)
    # init_weights=False skips the slow scipy truncated-normal init; weights are random anyway.
    model = torchvision.models.inception_v3(weights=None, aux_logits=False, init_weights=False,
                                           num_classes=CLASSES)
    return model.eval(), (_image(96),), {}


def tv_efficientnet_b0():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.efficientnet_b0(weights=None, num_classes=CLASSES)
    return model.eval(), (_image(64),), {}


def tv_deeplabv3_mobilenet_v3_large():
    import torchvision

    torch.manual_seed(0)
    # weights_backbone defaults to ImageNet weights (a download): None keeps it random.
    # Returns {"out": (1, CLASSES, 96, 96)}; the dilated backbone has output stride 16.
    model = torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=CLASSES)
    return model.eval(), (_image(96),), {}


# ---------------------------------------------------------------------------- timm


def timm_ghostnet_100():
    return _timm("ghostnet_100", 64)


def timm_fastvit_t8():
    return _timm("fastvit_t8", 64)


def timm_maxvit_pico():
    # MaxViT's window and grid partitions are img_size // 32: 4x4 at 128 px (8x8 at the
    # registered 256). img_size must match the input.
    return _timm("maxvit_pico_rw_256", 128, img_size=128)


def timm_efficientformer_l1():
    return _timm("efficientformer_l1", 224)


def timm_levit_128s():
    # Attention biases sized for img_size // 16 = 8x8 tokens, then 4x4 and 2x2.
    return _timm("levit_128s", 128, img_size=128)


def timm_convnext_atto():
    return _timm("convnext_atto", 64)


def timm_regnetx_002():
    return _timm("regnetx_002", 64)


def timm_mobilenetv4_conv_small():
    return _timm("mobilenetv4_conv_small", 64)


def timm_efficientvit_b0():
    # MIT EfficientViT: ReLU linear attention with multi-scale aggregation.
    return _timm("efficientvit_b0", 64)
