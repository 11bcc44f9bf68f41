"""Random weights whose signal survives the whole model: every suite factory of a Hugging
Face model returns its model through ``unit_scaled``; ``spread_problems`` says which
outputs a validation could not tell from a constant.

Why: transformers initializes every linear and convolution weight with one standard
deviation (``initializer_range``, 0.02) whatever its fan-in, and a fresh BatchNorm in eval
mode (running mean 0, variance 1) is the identity, so in a conv/BatchNorm stack each layer
multiplies the signal by about 0.02 x sqrt(fan-in), a factor below 1, and nothing
renormalizes it: MobileNets' logits came out near 1e-30, MobileViT's underflowed to
exactly 0, and validation compared zeros with zeros. LayerNorm models renormalize every
block, so only their last layers' 0.02 shows (logits near 0.01).

The rule (LSUV, layer-sequential unit variance, Mishkin & Matas 2016, without its
orthogonal start; the root mean square rather than the standard deviation, which a
two-element output estimates badly): one forward pass over the factory's own example
inputs, in execution order, divides each linear or convolution layer's weight and bias by
the root mean square of what it outputs on its first call, and passes the rescaled output
on, so every later layer sees the rescaled signal. A layer called again (ALBERT's shared
layer) keeps its first scale; a layer whose output is all zeros is left as it is. No
parameter changes shape or dtype, and the model stays in eval mode.

torchvision and timm (gpu_only.py) initialize by fan-in already and are not rescaled.

Imported as a sibling by the factory files (`exporter build` puts a spec file's folder on
sys.path), so matrix.py names this file in every model's ``depends`` (the cache key).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

SCALED = (nn.Linear, nn.modules.conv._ConvNd, Conv1D)  # Conv1D: GPT-2's transposed linear

# An output's spread (max - min) must be at least this share of max(1, max|x|): a constant
# at its midrange then misses by an eighth of its scale, far past any gate's floor (bf16:
# 8e-3 of it), so a build that returns a constant (zeros included) cannot pass.
MIN_SPREAD = 0.25


def unit_scaled(model: nn.Module, args: tuple, kwargs: dict) -> tuple[nn.Module, tuple, dict]:
    """``(model, args, kwargs)`` with the model's layers rescaled in place (module
    docstring); returned as given, so a factory can end in ``return unit_scaled(...)``."""
    done: set[int] = set()

    def rescale(module: nn.Module, _inputs, output):
        if id(module) in done or not isinstance(output, torch.Tensor):
            return None
        done.add(id(module))
        rms = float(output.detach().double().square().mean().sqrt())
        if not 1e-30 < rms < float("inf"):
            return None
        module.weight.div_(rms)
        if getattr(module, "bias", None) is not None:
            module.bias.div_(rms)
        return output / rms

    handles = [m.register_forward_hook(rescale) for m in model.modules()
               if isinstance(m, SCALED)]
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return model, args, kwargs


def spread_problems(outputs: list[torch.Tensor]) -> list[str]:
    """One line per float output (of more than one element) that is not finite or whose
    spread is under MIN_SPREAD of its scale; none for a healthy model."""
    problems = []
    for index, out in enumerate(outputs):
        if not out.is_floating_point() or out.numel() < 2:
            continue
        x = out.detach().double()
        if not torch.isfinite(x).all():
            problems.append(f"output {index} {list(out.shape)}: holds NaN or inf")
            continue
        spread, scale = float(x.max() - x.min()), max(1.0, float(x.abs().max()))
        if spread < MIN_SPREAD * scale:
            problems.append(f"output {index} {list(out.shape)}: spread {spread:.3g} under "
                            f"{MIN_SPREAD:g} x max(1, max|x|) = {MIN_SPREAD * scale:.3g}")
    return problems
