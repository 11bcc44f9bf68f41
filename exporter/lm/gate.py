"""The accuracy gate of a generating build (exporter/lm/validate.py says what is checked).

Per prompt, eager logits come from one full forward over prompt + the artifact's tokens
(teacher forcing: eager sees exactly the prefixes the artifact saw), at float32 and, for
the float tolerance, float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from exporter.model.given_module import converted_copy
from exporter.validation.gates import FLOAT32_REFERENCE_FLOOR, TOLERANCES, Tolerance, compare_output

# (min top-1 agreement, max mean KL in nats) against eager float32, per kind of build:
# bounds for trained weights (fp16 and bf16 rounding, int8 and int4 weights as llama.cpp and
# ONNX Runtime GenAI quantize them). A random-weight model is no test of them (rounding in
# eager itself fails them: docs/design-notes.md); such builds set --min-top1/--max-kl.
TEACHER_FORCED = {"fp16": (0.90, 0.02), "bf16": (0.80, 0.05),
                  "int8": (0.85, 0.05), "int4": (0.70, 0.20)}


@dataclass(frozen=True)
class GenerationGate:
    """The gate of a generating build: a ``Verdict`` (exporter/validation/gates.py) that
    judges whole generations, not one output."""

    exact_tokens: bool  # (a) and the float tolerance apply (fp32, not quantized)
    tolerance: Tolerance
    min_top1: float
    max_kl: float
    label: str  # "fp32", "fp16", "int8-weight", ...

    @classmethod
    def for_build(cls, dtype: str, quantize: str | None, *, min_top1: float | None = None,
                  max_kl: float | None = None) -> "GenerationGate":
        """``min_top1``/``max_kl``: the user's bounds (--min-top1, --max-kl), else the kind's.
        A random-weight model can need wide ones: its flat, chaotic logits turn rounding into
        large changes."""
        if quantize is None and dtype == "fp32":
            return cls(True, TOLERANCES["fp32"], 1.0, 0.0, "fp32")
        kind = dtype if quantize is None else ("int4" if "int4" in quantize else "int8")
        top1, kl = TEACHER_FORCED[kind]
        return cls(False, TOLERANCES[dtype], top1 if min_top1 is None else min_top1,
                   kl if max_kl is None else max_kl, quantize or dtype)

    @property
    def bisects(self) -> bool:
        """Only the exact gate's misses are bugs to find (validation/gates.py's Verdict):
        a labelled build drifts everywhere by design."""
        return self.exact_tokens

    def describe(self) -> str:
        if self.exact_tokens:
            return ("greedy tokens equal Hugging Face generate's (a divergence only at a "
                    "numerical tie: eager's top-2 margin within twice the allowed logit error); "
                    "teacher-forced logits and prefill+decode vs a fresh prefill within "
                    + self.tolerance.describe())
        return (f"{self.label} build (labelled): teacher-forced top-1 agreement >= "
                f"{self.min_top1:g} and mean KL(eager fp32 || artifact) <= {self.max_kl:g} "
                "nats over every generated position")

    def failure(self) -> str:
        if self.exact_tokens:
            return "the artifact does not generate what Hugging Face generate does"
        return (f"the {self.label} artifact misses the generation gate against eager float32 "
                f"(top-1 >= {self.min_top1:g}, KL <= {self.max_kl:g}; --min-top1, --max-kl)")

    def record(self, rows: list[dict], new_tokens: int) -> dict:
        positions = sum(r["new_tokens"] for r in rows)
        top1 = sum(r["top1_agreement"] * r["new_tokens"] for r in rows) / max(positions, 1)
        kl = sum(r["mean_kl"] * r["new_tokens"] for r in rows) / max(positions, 1)
        if self.exact_tokens:
            passed = all(r["passed"] for r in rows)
        else:
            passed = top1 >= self.min_top1 and kl <= self.max_kl
        first = next((r["divergence"] for r in rows if r.get("divergence")), None)
        return {"passed": passed, "kind": "generation", "exact_tokens": self.exact_tokens,
                "policy": self.describe(),
                "cases": len(rows), "new_tokens_per_case": new_tokens,
                "top1_agreement": top1, "mean_kl": kl,
                "tokens_identical": all(r["tokens_match"] for r in rows),
                "first_divergence": first, "outputs": rows, "warnings": _tie_notes(rows)}


class EagerLogits:
    """Eager full forwards over a sequence: float32, and float64 on demand."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._model64: torch.nn.Module | None = None
        self.note: str | None = None  # why the float64 reference became float32's

    def at(self, sequence: list[int], start: int, count: int, *, float64: bool = False,
           encoder: dict | None = None) -> torch.Tensor:
        """``encoder``: an encoder-decoder's source (``sequence`` is then its decoder's).
        A model that cannot run at float64 gives float32's logits, and ``note`` says so,
        as a plain build's validation does (exporter/validation/validate.py)."""
        if float64 and self.note is None:
            try:
                if self._model64 is None:
                    self._model64 = _float64_copy(self.model)
                return self._logits(self._model64, sequence, start, count, encoder)
            except Exception as exc:  # noqa: BLE001 - XGLM: torch.full(finfo(float64).min) in float32
                first = (str(exc).strip().splitlines() or [""])[0][:200]
                self.note = (f"float64 reference failed ({type(exc).__name__}: {first}); used "
                             f"float32, with a floor of {FLOAT32_REFERENCE_FLOOR:g} x max(1, max|ref|)")
                self._model64 = None
        return self._logits(self.model, sequence, start, count, encoder)

    @staticmethod
    def _logits(model: torch.nn.Module, sequence: list[int], start: int, count: int,
                encoder: dict | None) -> torch.Tensor:
        device = next(model.parameters()).device
        ids = torch.tensor([sequence], device=device)
        with torch.no_grad():
            if encoder:
                dtype = next(model.parameters()).dtype
                given = {k: v.to(dtype) if v.is_floating_point() else v
                         for k, v in encoder.items()}
                logits = model(**given, decoder_input_ids=ids).logits
            else:
                logits = model(input_ids=ids).logits
        return logits[0, start:start + count].cpu()


def _float64_copy(model: torch.nn.Module) -> torch.nn.Module:
    """The reference model in float64. Mixture-of-experts layers run transformers' eager
    experts: its default ``grouped_mm`` has no float64 kernel (Qwen2-MoE's validation
    failed with "Expected mat_a to be Float32, BFloat16 or Float16")."""
    copied = converted_copy(model, dtype=torch.float64).eval()
    setter = getattr(copied, "set_experts_implementation", None)
    if setter is not None:
        try:
            setter("eager")
        except ValueError:  # a model without experts (or that cannot switch them)
            pass
    return copied


def judge_case(case: str, eager: EagerLogits, prompt: list[int], reference: list[int],
               got: dict[str, torch.Tensor], gate: GenerationGate,
               encoder: dict | None = None) -> dict:
    tokens = got["tokens"].tolist()
    logits = got["logits"].double()
    count = len(tokens)
    l32 = eager.at(prompt + tokens, len(prompt) - 1, count, encoder=encoder).double()
    row = {"case": case, "prompt_tokens": len(prompt), "new_tokens": count,
           "tokens": tokens, "reference_tokens": reference,
           "tokens_match": tokens == reference,
           "top1_agreement": float((logits.argmax(-1) == l32.argmax(-1)).double().mean()),
           "mean_kl": _mean_kl(l32, logits)}
    first = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), None)
    if gate.exact_tokens:
        l64 = eager.at(prompt + tokens, len(prompt) - 1, count, float64=True,
                       encoder=encoder).double()
        # float32's logits where the model cannot run at float64 (EagerLogits.note)
        tolerance = gate.tolerance if eager.note is None else gate.tolerance.without_float64()
        row["logits"] = compare_output(logits, l64, l32, tolerance)
        if count >= 2:  # decode after prefill == a fresh prefill over one more token
            row["cache_consistency"] = compare_output(got["consistency"].double(), l64[1],
                                                      l32[1], tolerance)
            row["cache_consistency"]["decode_vs_prefill_max_abs_err"] = float(
                (got["consistency"].double() - logits[1]).abs().max())
        if first is not None:
            row["divergence"] = _divergence(case, first, tokens, reference, logits, l64, l32,
                                            tolerance)
        row["passed"] = ((first is None or row["divergence"]["tie"])
                         and row["logits"]["passed"]
                         and row.get("cache_consistency", {"passed": True})["passed"])
    else:
        row["passed"] = None  # judged over all prompts together (GenerationGate.record)
        if count >= 2:  # recorded, not gated: the cache holds what a fresh prefill computes
            row["decode_vs_prefill_max_abs_err"] = float(
                (got["consistency"].double() - logits[1]).abs().max())
        if first is not None:
            row["divergence"] = _divergence(case, first, tokens, reference, logits, l32, l32,
                                            gate.tolerance)
    return row


def _divergence(case: str, step: int, tokens: list[int], reference: list[int],
                logits: torch.Tensor, ref: torch.Tensor, l32: torch.Tensor,
                tol: Tolerance) -> dict:
    top2 = torch.topk(ref[step], 2).values
    margin = float(top2[0] - top2[1])
    eager_err = float((l32[step] - ref[step]).abs().max())
    allowed = tol.factor * eager_err + tol.floor * max(1.0, float(ref[step].abs().max()))
    return {"case": case, "step": step, "artifact_token": tokens[step],
            "reference_token": reference[step], "eager_top2_margin": margin,
            "max_logit_err": float((logits[step] - ref[step]).abs().max()),
            "allowed_logit_err": allowed, "tie": margin <= 2 * allowed}


def _mean_kl(reference: torch.Tensor, got: torch.Tensor) -> float:
    p_log = torch.log_softmax(reference, -1)
    q_log = torch.log_softmax(got, -1)
    return float((p_log.exp() * (p_log - q_log)).sum(-1).mean())


def _tie_notes(rows: list[dict]) -> list[str]:
    return [f"{r['case']}: tokens diverge at step {r['divergence']['step']} at a numerical tie "
            f"(eager's top-2 margin {r['divergence']['eager_top2_margin']:.2e}); the tokens "
            "after it are compared teacher-forced" for r in rows
            if r.get("divergence", {}).get("tie")]


def summary_lines(record: dict) -> list[str]:
    lines = [f"top-1 agreement {record['top1_agreement']:.3f}, mean KL "
             f"{record['mean_kl']:.2e} over {record['cases']} prompts"]
    first = record.get("first_divergence")
    if first:
        # a labelled gate (fp16, quantized) judges top-1 and KL: fp32's logit bound means nothing
        allowed = (f", allowed {first['allowed_logit_err']:.3g}"
                   if record.get("exact_tokens", True) else "")
        lines.append(f"first divergence: {first['case']} step {first['step']}: artifact token "
                     f"{first['artifact_token']}, Hugging Face {first['reference_token']} "
                     f"(largest logit error there {first['max_logit_err']:.3g}{allowed}; eager "
                     f"top-2 margin {first['eager_top2_margin']:.3g})")
    for row in record["outputs"]:
        for key in ("logits", "cache_consistency"):
            judged = row.get(key)
            if judged and not judged["passed"]:
                lines.append(f"{row['case']} {key.replace('_', ' ')}: max abs error "
                             f"{judged['max_abs_err']:.3g} over the allowed "
                             f"{judged['allowed']:.3g}")
    return lines
