"""The report's validation section, from the manifest's record. A plain build's record
(exporter/validation/validate.py): each output against eager, per input set. A generating
build's (exporter/lm/gate.py, ``kind: "generation"``): per prompt, the greedy tokens
against transformers' generate, the teacher-forced logits and the cache's consistency
(prefill + one decode step against a fresh prefill), each float comparison with its own
error histogram."""

from __future__ import annotations

from collections import Counter
from html import escape

from exporter.report import charts
from exporter.report.console import validation_lines
from exporter.report.page import prose, table
from exporter.validation.gates import ERROR_BINS, error_bin

# A generating record's row: its float comparisons against eager, and what each compares.
GENERATION_JUDGED = {"logits": "teacher-forced logits",
                     "cache_consistency": "prefill + one decode step vs a fresh prefill"}


def judged(row: dict) -> list[dict]:
    """The float comparisons one record row holds: the row itself (a plain build's
    output), or a generating row's logits and cache consistency."""
    if any(key in row for key in GENERATION_JUDGED):
        return [row[key] for key in GENERATION_JUDGED if isinstance(row.get(key), dict)]
    return [row]


def validation_section(record: dict | None) -> str:
    lines = "".join(f"<p>{prose(line)}</p>" for line in validation_lines(record))
    if not record or record.get("skipped"):
        return f'<section id="validation"><h2>Validation</h2>{lines}</section>'
    if record.get("kind") == "generation":
        return ('<section id="validation"><h2>Validation against transformers\' generate'
                "</h2>" + lines + _generation(record) + "</section>")
    return ('<section id="validation"><h2>Validation against eager</h2>' + lines
            + _outputs(record) + "</section>")


def _outputs(record: dict) -> str:
    rows = record.get("outputs", [])
    per_output: dict[str, Counter] = {}
    allowed: dict[str, float] = {}
    for row in rows:
        name = str(row.get("output"))
        per_output.setdefault(name, Counter()).update(row.get("abs_err_histogram") or {})
        if _is_number(row.get("allowed")):
            allowed[name] = max(allowed.get(name, 0.0), row["allowed"])
    charts_html = "".join(
        charts.histogram(counts, ERROR_BINS,
                         error_bin(allowed[name]) if name in allowed else None,
                         f"{name}: |artifact − reference| per element, all cases")
        for name, counts in per_output.items() if counts)
    if not charts_html:
        charts_html = "<p>(this artifact's validation predates error histograms)</p>"
    cells = [[r.get("case"), r.get("output"), _verdict(r.get("passed")), r.get("criterion", ""),
              figure(r)] for r in rows]
    return charts_html + table(["case", "output", "verdict", "criterion", "figures"], cells)


def _generation(record: dict) -> str:
    rows = record.get("outputs", [])
    charts_html = ""
    for key, what in GENERATION_JUDGED.items():
        counts, allowed = Counter(), None
        for row in rows:
            found = row.get(key) if isinstance(row.get(key), dict) else {}
            counts.update(found.get("abs_err_histogram") or {})
            if _is_number(found.get("allowed")):
                allowed = max(allowed or 0.0, found["allowed"])
        if counts:
            charts_html += charts.histogram(
                counts, ERROR_BINS, error_bin(allowed) if allowed is not None else None,
                f"{what}: |artifact − eager| per element, all prompts")
    if not charts_html:  # fp16, bf16, quantized: a labelled gate of top-1 and KL
        charts_html = ("<p class=\"hint\">a labelled gate (teacher-forced top-1 agreement and "
                       "KL divergence against eager float32), no per-element tolerance</p>")
    cells = [[r.get("case"), r.get("prompt_tokens"), r.get("new_tokens"), _tokens(r),
              number(r.get("top1_agreement"), ".1%"), number(r.get("mean_kl"), ".2e"),
              figure(r["logits"]) if isinstance(r.get("logits"), dict) else "-",
              _cache(r), _verdict(r.get("passed"))] for r in rows]
    return (charts_html + _divergence(record.get("first_divergence"))
            + table(["case", "prompt tokens", "new tokens", "tokens vs generate",
                     "top-1", "KL", "logits", "cache consistency", "verdict"], cells))


def _tokens(row: dict) -> str:
    if row.get("tokens_match"):
        return "identical"
    divergence = row.get("divergence") or {}
    if "step" not in divergence:
        return "differ"
    return f"differ from step {divergence['step']}" + (" (a tie)" if divergence.get("tie")
                                                         else "")


def _cache(row: dict) -> str:
    found = row.get("cache_consistency")
    if isinstance(found, dict):
        return figure(found)
    if _is_number(row.get("decode_vs_prefill_max_abs_err")):
        return f"decode vs prefill max |err| {row['decode_vs_prefill_max_abs_err']:.3g}"
    return "-"


def _divergence(first: dict | None) -> str:
    if not isinstance(first, dict):
        return ""
    return (f"<p>first divergence: {escape(str(first.get('case')))} at step "
            f"{escape(str(first.get('step')))}, the artifact's token "
            f"{escape(str(first.get('artifact_token')))} where generate chose "
            f"{escape(str(first.get('reference_token')))}; eager's top-2 margin "
            f"{number(first.get('eager_top2_margin'), '.3g')}, logit error "
            f"{number(first.get('max_logit_err'), '.3g')} (allowed "
            f"{number(first.get('allowed_logit_err'), '.3g')})"
            + (": a numerical tie" if first.get("tie") else "") + "</p>")


def figure(row: dict) -> str:
    """One comparison's figures, as the gate judged it."""
    if row.get("criterion") == "relative-to-eager":
        return (f"max |err| {number(row.get('max_abs_err'), '.3g')} (allowed "
                f"{number(row.get('allowed'), '.3g')}, eager's own "
                f"{number(row.get('eager_max_abs_err'), '.3g')})")
    if row.get("criterion") == "quantized":
        return (f"SQNR {number(row.get('sqnr_db'), '.1f')} dB, cosine "
                f"{number(row.get('cosine'), '.5f')}")
    return str(row.get("problem") or f"{row.get('mismatches', 0)} mismatches")


def _verdict(passed: bool | None) -> str:
    return {True: "passed", False: "FAILED"}.get(passed, "judged over all prompts")


def number(value, spec: str) -> str:
    """A figure as ``spec`` formats it; a record's "nan" (strict JSON) or a gap as it is."""
    return format(value, spec) if _is_number(value) else str(value if value is not None
                                                              else "-")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
