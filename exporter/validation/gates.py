"""The accuracy gates validation judges an artifact's outputs by: one ``Gate`` protocol,
two criteria (and ``Verdict``, the part every build's gate has, a generating one's too).

``Tolerance`` (float builds): the reference is eager at float64 where the model allows
it; the artifact's max abs error to it must be within ``factor x`` eager's own error at
the artifact's dtype plus a floor of ``floor x max|ref|`` (an exact eager error of 0 must
not demand bit-exactness). For fp16/bf16 builds, "eager at the artifact's dtype" is the
cast program run eagerly, and the floors are looser. Integer and bool outputs match eager
exactly; NaN and Inf positions match.

``QuantGate`` (--quantize builds): quantization changes the function on purpose, so the
float64 criterion would always fail; instead a labelled criterion, SQNR or cosine against
eager float32.

This module imports nothing from the rest of ``exporter``: validation and
builder/quantization.py both use it, and it must not close a circle between them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from passes.quantize.quant_error import sqnr_cosine


class Verdict(Protocol):
    """What a build's validation needs from any gate, whatever it judges (one output
    here; a whole generation in exporter/lm/gate.py's ``GenerationGate``)."""

    # Whether a failure is worth bisecting to a partition: a float mismatch is a bug
    # somewhere in the lowering; a quantized build drifts everywhere by design.
    bisects: bool

    def describe(self) -> str:
        """The policy, labelled, as the manifest's validation record states it."""
        ...

    def failure(self) -> str:
        """The headline of the error a build that misses this gate raises."""
        ...


class Gate(Verdict, Protocol):
    """What validate() needs from an accuracy judge of outputs."""

    # True: judge against eager at float64 where the model allows it (eager at the
    # artifact's dtype is then the yardstick); False: eager at the artifact's dtype is
    # the reference itself, and no float64 copy of the model is made.
    float64_reference: bool

    def judge(self, got: torch.Tensor, reference: torch.Tensor,
              eager: torch.Tensor) -> dict:
        """One output of one case: a manifest row with at least ``passed``."""
        ...

    def without_float64(self) -> Gate:
        """The gate for a case whose float64 reference could not be computed."""
        ...


@dataclass(frozen=True)
class Tolerance:
    factor: float = 10.0  # AOTInductor reorders reductions and picks other GEMM kernels
    floor: float = 1e-6

    # Plain class attributes (no annotation), so they are not dataclass fields.
    float64_reference = True
    bisects = True

    @classmethod
    def for_dtype(cls, dtype: str) -> Tolerance:
        return TOLERANCES[dtype]

    def judge(self, got: torch.Tensor, reference: torch.Tensor,
              eager: torch.Tensor) -> dict:
        return compare_output(got, reference, eager, self)

    def describe(self) -> str:
        return (f"float outputs: max|artifact - ref| <= {self.factor:g} x max|eager - ref| "
                f"(eager at the artifact's dtype) + "
                f"{self.floor:g} x max(1, max|ref|); integer/bool exact; NaN/Inf positions equal")

    def failure(self) -> str:
        return "the artifact does not match eager PyTorch on the validation inputs"

    def without_float64(self) -> Tolerance:
        """The criterion where eager cannot run at float64 (a kernel without a float64
        version; XGLM builds a float32 constant from float64's range): eager at the
        artifact's dtype is then the reference, its own error to it is 0, and the floor
        alone must hold two float32 computations' rounding apart. It becomes the bound a
        bisect calls a divergence at fp32 (exporter/validation/bisect.py DIVERGES): at
        1e-6, an onnx XGLM with identical tokens and a KL of 2e-13 failed at 5e-6."""
        return Tolerance(self.factor, max(self.floor, FLOAT32_REFERENCE_FLOOR))


FLOAT32_REFERENCE_FLOOR = 1e-4
TOLERANCES = {"fp32": Tolerance(10.0, 1e-6), "fp16": Tolerance(10.0, 1e-3),
              "bf16": Tolerance(10.0, 8e-3)}


@dataclass(frozen=True)
class QuantGate:
    """The accuracy gate of a quantized build: labelled, against eager float32."""

    min_sqnr_db: float
    min_cosine: float
    recipe: str  # e.g. "int8-dynamic": named in the failure

    float64_reference = False
    bisects = False

    def judge(self, got: torch.Tensor, reference: torch.Tensor,
              eager: torch.Tensor) -> dict:
        # ``reference`` is eager float32 itself here (float64_reference is False).
        return compare_quantized(got, eager, self.min_sqnr_db, self.min_cosine)

    def describe(self) -> str:
        return ("quantized build (labelled: the function changes on purpose): per float "
                f"output, SQNR >= {self.min_sqnr_db:g} dB or cosine >= {self.min_cosine:g} "
                "against eager float32; top-1 agreement reported for (batch, classes) "
                "outputs; integer outputs exact")

    def failure(self) -> str:
        return f"the {self.recipe} artifact misses the accuracy gate against eager float32"

    def without_float64(self) -> QuantGate:
        return self  # its reference is eager float32 already


def compare_output(got: torch.Tensor, ref: torch.Tensor, eager: torch.Tensor,
                   tol: Tolerance) -> dict:
    """The float criterion on one output (module docstring)."""
    if got.shape != eager.shape or got.dtype != eager.dtype:
        return _shape_problem(got, eager)
    if not got.dtype.is_floating_point and not got.dtype.is_complex:
        return _exact(got, eager)
    g, r, e = got.double(), ref.double(), eager.double()
    nonfinite_ok = bool(torch.equal(torch.isnan(g), torch.isnan(e))
                        and torch.equal(torch.isposinf(g), torch.isposinf(e))
                        and torch.equal(torch.isneginf(g), torch.isneginf(e)))
    finite = torch.isfinite(r) & torch.isfinite(g) & torch.isfinite(e)
    err = float((g - r)[finite].abs().max()) if finite.any() else 0.0
    eager_err = float((e - r)[finite].abs().max()) if finite.any() else 0.0
    scale = max(1.0, float(r[finite].abs().max())) if finite.any() else 1.0
    allowed = tol.factor * eager_err + tol.floor * scale
    return {"passed": nonfinite_ok and err <= allowed, "criterion": "relative-to-eager",
            "max_abs_err": err, "eager_max_abs_err": eager_err, "allowed": allowed,
            "ratio_to_allowed": err / allowed if allowed else 0.0,
            "nan_inf_positions_match": nonfinite_ok,
            # how many, so a summary says what it saw: "match" alone read as "there are some"
            "nonfinite": {"artifact": int((~torch.isfinite(g)).sum()),
                          "eager": int((~torch.isfinite(e)).sum())},
            "abs_err_histogram": error_histogram((g - r)[finite].abs())}


def nonfinite_text(row: dict) -> str:
    """What a row's NaN/Inf check saw, in words that are true of it."""
    counts = row.get("nonfinite")
    if counts is None:  # a record from before the counts were kept
        return f"NaN/Inf positions match: {row['nan_inf_positions_match']}"
    artifact, eager = counts["artifact"], counts["eager"]
    if row["nan_inf_positions_match"]:
        return (f"NaN/Inf at the same {eager} position(s) as eager" if eager
                else "no NaN/Inf in either")
    return (f"NaN/Inf positions differ: the artifact has {artifact}, eager {eager}")


def error_text(row: dict) -> str:
    """The max-error half of a row's summary, its comparison the one that holds."""
    err, allowed = row["max_abs_err"], row["allowed"]
    some_nonfinite = any((row.get("nonfinite") or {}).values())
    return (f"max abs error {err:.3g} {'>' if err > allowed else '<='} allowed {allowed:.3g}"
            + (" (over the elements finite in both)" if some_nonfinite else ""))


# The record's SQNR within float64's resolution (about 313 dB): an exact output's infinite
# SQNR (both all zeros, say) is no JSON number, and the manifest must stay JSON.
SQNR_LIMIT_DB = 300.0


def compare_quantized(got: torch.Tensor, eager: torch.Tensor, min_sqnr_db: float,
                      min_cosine: float) -> dict:
    """SQNR and cosine against eager float32; top-1 agreement for [batch, classes] outputs.
    Integer outputs still match exactly."""
    if got.shape != eager.shape or got.dtype != eager.dtype:
        return _shape_problem(got, eager)
    if not got.dtype.is_floating_point:
        return _exact(got, eager)
    g, e = got.double().flatten(), eager.double().flatten()
    sqnr, cosine = sqnr_cosine(g, e)
    row = {"passed": sqnr >= min_sqnr_db or cosine >= min_cosine, "criterion": "quantized",
           "sqnr_db": max(-SQNR_LIMIT_DB, min(sqnr, SQNR_LIMIT_DB)), "cosine": cosine,
           "min_sqnr_db": min_sqnr_db,
           "min_cosine": min_cosine, "abs_err_histogram": error_histogram((g - e).abs())}
    if got.dim() == 2 and got.shape[1] > 1:  # classifier-shaped: [batch, classes]
        row["top1_agreement"] = float((got.argmax(1) == eager.argmax(1)).double().mean())
    return row


def _shape_problem(got: torch.Tensor, eager: torch.Tensor) -> dict:
    return {"passed": False, "problem": f"artifact gave {got.dtype}{list(got.shape)}, eager "
                                        f"gives {eager.dtype}{list(eager.shape)}"}


def _exact(got: torch.Tensor, eager: torch.Tensor) -> dict:
    mismatches = int((got != eager).sum())
    return {"passed": mismatches == 0, "criterion": "exact", "mismatches": mismatches}


# Error histogram bins (`exporter report` draws them): exact zeros, then one bin per decade
# of |error| from below 1e-12 up to 1 and above. Keys are the bins' lower edges.
ERROR_BINS = ("0", "<1e-12", *(f"1e{e:+03d}" for e in range(-12, 0)), ">=1")


def error_histogram(abs_err: torch.Tensor) -> dict[str, int]:
    """Elements per decade of absolute error: where max_abs_err says how bad the worst
    element is, this says whether it is one outlier or the whole tensor."""
    flat = abs_err.double().flatten()
    zero = int((flat == 0).sum())
    decade = torch.floor(torch.log10(flat[flat > 0])).clamp(-13, 0).long()
    counts = torch.bincount(decade + 13, minlength=14).tolist()
    return dict(zip(ERROR_BINS, [zero, *counts]))


def error_bin(value: float) -> str:
    """The ERROR_BINS key a single |error| falls in."""
    counts = error_histogram(torch.tensor([abs(value)]))
    return next(name for name, count in counts.items() if count)
