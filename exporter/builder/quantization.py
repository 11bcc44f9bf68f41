"""--quantize at build time: which target runs which recipe, the calibration data, and
the accuracy gate that judges a quantized artifact (quantization changes the function on
purpose, so it gets its own, labelled criterion instead of the float tolerance)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from exporter.errors import UserInputError
from exporter.settings import BuildSettings
from exporter.validation.validate import error_histogram
from exporter.validation.inputs import draw_like, load_input_file
from runtime.manifest import Signature
from targets import Target, all_targets

log = logging.getLogger(__name__)
RANDOM_CALIBRATION_SETS = 8
RANDOM_CALIBRATION_WARNING = (
    "int8-static calibrated on RANDOM inputs (--calibration random): activation ranges from "
    "random data can be far from real ones, and the accuracy gate then judges the model on "
    "data it will never see; calibrate with --calibration FILE.npz of representative inputs")


def check_recipe(target: Target, settings: BuildSettings) -> None:
    """Before any work: the recipe exists for this target and has what it needs."""
    recipe = settings.quantize
    if recipe is None:
        if settings.calibration is not None:
            raise UserInputError("--calibration is given without --quantize int8-static",
                                 hint="add --quantize int8-static, or drop --calibration")
        return
    if recipe not in target.quant_recipes:
        can = [f"{name}: {', '.join(t.quant_recipes) or 'none yet'}"
               for name, t in all_targets().items()]
        raise UserInputError(f"target '{target.name}' cannot run --quantize {recipe}",
                             details=can, hint="choose a recipe the target lists, or "
                                               "another target")
    if settings.dtype != "fp32":
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


def compare_quantized(got: torch.Tensor, eager: torch.Tensor, min_sqnr_db: float,
                      min_cosine: float) -> dict:
    """SQNR and cosine against eager float32; top-1 agreement for [batch, classes] outputs.
    Integer outputs still match exactly."""
    if got.shape != eager.shape or got.dtype != eager.dtype:
        return {"passed": False, "problem": f"artifact gave {got.dtype}{list(got.shape)}, eager "
                                            f"gives {eager.dtype}{list(eager.shape)}"}
    if not got.dtype.is_floating_point:
        mismatches = int((got != eager).sum())
        return {"passed": mismatches == 0, "criterion": "exact", "mismatches": mismatches}
    g, e = got.double().flatten(), eager.double().flatten()
    noise = float((g - e).pow(2).mean())
    signal = float(e.pow(2).mean())
    sqnr = math.inf if noise == 0 else (10 * math.log10(signal / noise) if signal else -math.inf)
    norms = float(g.norm() * e.norm())
    cosine = float(g @ e) / norms if norms else float(torch.equal(g, e))
    row = {"passed": sqnr >= min_sqnr_db or cosine >= min_cosine, "criterion": "quantized",
           "sqnr_db": sqnr, "cosine": cosine, "min_sqnr_db": min_sqnr_db,
           "min_cosine": min_cosine, "abs_err_histogram": error_histogram((g - e).abs())}
    if got.dim() == 2 and got.shape[1] > 1:  # classifier-shaped: [batch, classes]
        row["top1_agreement"] = float((got.argmax(1) == eager.argmax(1)).double().mean())
    return row


@dataclass(frozen=True)
class QuantGate:
    """The accuracy gate of a quantized build; the counterpart of validate.Tolerance."""

    min_sqnr_db: float
    min_cosine: float

    def judge(self, got: torch.Tensor, eager: torch.Tensor) -> dict:
        return compare_quantized(got, eager, self.min_sqnr_db, self.min_cosine)

    def describe(self) -> str:
        return ("quantized build (labelled: the function changes on purpose): per float "
                f"output, SQNR >= {self.min_sqnr_db:g} dB or cosine >= {self.min_cosine:g} "
                "against eager float32; top-1 agreement reported for (batch, classes) "
                "outputs; integer outputs exact")
