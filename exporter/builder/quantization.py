"""--quantize at build time: which target runs which recipe, and the calibration data.
The accuracy gate that judges a quantized artifact is validation's
(exporter/validation/gates.py, ``QuantGate``)."""

from __future__ import annotations

import logging

import torch

from exporter.errors import UserInputError
from exporter.kinds import BuildKind
from exporter.settings import BuildSettings
from exporter.validation.inputs import draw_like, load_input_file
from runtime.format.manifest import Signature
from targets import Target, all_targets

log = logging.getLogger(__name__)
RANDOM_CALIBRATION_SETS = 8
RANDOM_CALIBRATION_WARNING = (
    "int8-static calibrated on RANDOM inputs (--calibration random): activation ranges from "
    "random data can be far from real ones, and the accuracy gate then judges the model on "
    "data it will never see; calibrate with --calibration FILE.npz of representative inputs")


def check_recipe(target: Target, settings: BuildSettings, kind: BuildKind) -> None:
    """Before any work: the recipe exists for this target and has what it needs."""
    recipe = settings.quantize
    if recipe is None:
        if settings.calibration is not None:
            raise UserInputError("--calibration is given without --quantize int8-static",
                                 hint="add --quantize int8-static, or drop --calibration")
        return
    if recipe not in target.quantization.recipes:
        can = [f"{name}: {', '.join(t.quantization.recipes) or 'none yet'}"
               for name, t in all_targets().items()]
        raise UserInputError(f"target '{target.name}' cannot run --quantize {recipe}",
                             details=can, hint="choose a recipe the target lists, or "
                                               "another target")
    # A decoder's weight-only recipe keeps the activations at --dtype: decode steps are
    # memory-bound, and fp16 activations beside int8/int4 weights are what they run at
    # (the generation gate judges against eager fp32, exporter/lm/gate.py).
    weight_only = recipe.endswith("-weight") and kind.weight_only_keeps_dtype
    if settings.dtype != "fp32" and not weight_only:
        raise UserInputError(f"--quantize {recipe} with --dtype {settings.dtype}",
                             hint="quantized builds keep float math in fp32; drop --dtype")
    if recipe != "int8-static" and settings.calibration is not None:
        raise UserInputError(f"--calibration is given with --quantize {recipe}, which does "
                             "not calibrate", hint="only int8-static uses calibration data; "
                                                   "drop --calibration")
    if recipe == "int8-static" and settings.calibration is None:
        raise UserInputError("--quantize int8-static needs calibration data",
                             hint="--calibration FILE.npz (representative inputs, keys = input "
                                  "names), or --calibration random (warned: not for accuracy)")


def calibration_sets(settings: BuildSettings, signature: Signature,
                     example: list[torch.Tensor]) -> tuple[list[list[torch.Tensor]], list[str]]:
    """Flat input sets to calibrate on, and warnings."""
    if settings.quantize != "int8-static":
        return [], []
    if settings.calibration == "random":
        generator = torch.Generator().manual_seed(settings.seed)
        sets = [[draw_like(spec, ex.cpu(), "max", generator)  # dynamic dims at their max
                 for spec, ex in zip(signature.inputs, example)]
                for _ in range(RANDOM_CALIBRATION_SETS)]
        log.warning(RANDOM_CALIBRATION_WARNING)  # now, not only in the final report
        return sets, [RANDOM_CALIBRATION_WARNING]
    data = load_input_file(signature, settings.calibration)
    return [[data[spec.name] for spec in signature.inputs]], []
