"""The ``--quantize`` recipes a target runs, and the pass that runs them before lowering
(a target that quantizes inside ``lower()``, as onnx does, declares recipes only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from passes.base import Pass
from passes.quantize.quantize import QuantizePT2E
from passes.quantize.quantize_weight_only import Configure, QuantizeWeightOnly, Swap
from targets.options import LowerOptions


@dataclass(frozen=True)
class Quantization:
    # recipe -> how this target runs it (the report says it); none by default
    recipes: Mapping[str, str] = field(default_factory=dict)
    # weight-only recipe -> (the target's own swap of a linear for its format, the
    # format's layout as the report records it); torchao's tensors otherwise
    linear_formats: Mapping[str, tuple[Swap, str]] = field(default_factory=dict)

    def quantizer(self, recipe: str) -> object:
        """The torchao PT2E quantizer for one of ``recipes`` (weight-only recipes use
        torchao's tensor subclasses instead, the same on every target)."""
        raise NotImplementedError(f"no PT2E quantizer for recipe {recipe}")

    def record(self, recipe: str) -> dict:
        """What the quantize report adds for a PT2E recipe on this target (e.g. the
        activation bits the quantizer kept to)."""
        return {}

    def linear_format(self, recipe: str) -> tuple[Swap | None, str]:
        """This target's own (swap, layout) for a weight-only recipe's linears, or (None,
        "") for torchao's tensors."""
        return self.linear_formats.get(recipe, (None, ""))

    def layer_config(self, recipe: str) -> Configure | None:
        """This target's own torchao config for each layer of a tensor-subclass recipe
        (int8-weight, int4-weight), or None for the shared one (quantize_weight_only.py)."""
        return None

    def quantize_pass(self, options: LowerOptions, device: str) -> Pass | None:
        """The pass for ``options.quantize`` on a target whose partitions run on
        ``device``; None without --quantize."""
        recipe = options.quantize
        if not recipe:
            return None
        if recipe not in self.recipes:  # the pipeline checks first; this is a bug guard
            raise ValueError(f"recipe {recipe} is not one of {', '.join(self.recipes)}")
        how = self.recipes[recipe]
        if recipe in QuantizeWeightOnly.recipes:
            swap, layout = self.linear_format(recipe)
            return QuantizeWeightOnly(recipe, how, device, self.layer_config(recipe), swap,
                                      layout)
        return QuantizePT2E(recipe, lambda: self.quantizer(recipe), list(options.calibration),
                            how, self.record(recipe))
