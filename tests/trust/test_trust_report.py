"""`exporter report --html` on a generating artifact (a decoder or Whisper built with
`--task text-generation`): it ended in exit 4 (`KeyError: 'output'`) reading a generation
record as a plain one. The page now shows the generation's validation, and each program
(prefill, decode, encode) with its own signature, partitions, memory plan and passes."""

from __future__ import annotations

import copy
import json
import re

import pytest

from exporter.report.html import write_report
from exporter.report.validation import validation_section
from exporter.validation.gates import ERROR_BINS

pytest.importorskip("onnxruntime")
SECTIONS = ("signature", "placement", "validation", "latency", "layers", "quantization",
            "graphs", "memory", "passes")


def _text(html: str) -> str:
    """The page's words, without tags and scripts."""
    body = re.sub(r"<script.*?</script>", "", html, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body))


def test_a_generating_artifacts_report_shows_its_generation_and_every_entry_point(
        whisper_onnx, cli_here, tmp_path):
    (built, _), cli = whisper_onnx, cli_here  # the page, not the process (test_html_report)
    manifest = built.manifest
    out = tmp_path / "whisper.html"
    result = cli("report", str(built.artifact), "--html", str(out), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["html"] == str(out)
    page = out.read_text()
    for section in SECTIONS:
        assert page.count(f'<section id="{section}">') == 1, section
    record = manifest.validation
    assert record["kind"] == "generation" and "encode" in manifest.entry_points
    validation = re.search(r'<section id="validation">.*?</section>', page, re.S).group(0)
    # one histogram each: the teacher-forced logits and the cache's consistency
    assert validation.count('class="bin"') == 2 * len(ERROR_BINS)
    assert validation.count("<tr>") == 1 + len(record["outputs"])  # a row per prompt
    assert "identical" in validation and "Validation against transformers' generate" in validation
    # each program under its name, with its own signature, partitions and ops
    encode = manifest.entry_points["encode"]
    for section in ("signature", "placement", "layers", "graphs", "memory", "passes"):
        block = re.search(rf'<section id="{section}">.*?</section>', page, re.S).group(0)
        assert '<h3 class="program">encode</h3>' in block, section
    assert all(f'data-partition="{p.name}"' in page for p in manifest.all_partitions())
    shown = json.loads(re.search(r'<script id="report-data" type="application/json">(.*?)'
                                 "</script>", page, re.S).group(1))["coverage"]
    assert len(shown) == len(manifest.coverage) + len(encode.coverage)
    assert "[1, 16, 48]" in _text(page)  # the encoder's source features


def test_a_labelled_generation_gate_and_a_failed_one_show_without_float_figures(whisper_onnx):
    """fp16 and quantized generating builds record top-1 and KL only (no per-prompt
    verdict, no logits tolerance); a failed record holds a divergence and NaN as text."""
    record = copy.deepcopy(whisper_onnx[0].manifest.validation)
    for row in record["outputs"]:
        row.pop("logits"), row.pop("cache_consistency")
        row.update(passed=None, decode_vs_prefill_max_abs_err=1e-3, tokens_match=False,
                   divergence={"step": 3, "tie": False}, mean_kl="nan")
    record.update(exact_tokens=False, passed=False, tokens_identical=False, mean_kl=0.5,
                  first_divergence={"case": "case0", "step": 3, "artifact_token": 7,
                                    "reference_token": 9, "eager_top2_margin": 0.5,
                                    "max_logit_err": 2.0, "allowed_logit_err": 1e-4,
                                    "tie": False})
    text = _text(validation_section(record))
    assert "FAILED" in text and "labelled gate" in text and "differ from step 3" in text
    assert "first divergence: case0 at step 3" in text and "judged over all prompts" in text


def test_a_generating_artifacts_bench_is_shown_in_tokens_per_second(whisper_onnx, tmp_path):
    """`exporter bench --json` of a generating artifact gives tokens/s per engine, no
    latency per call: the report reads it instead of refusing it."""
    artifact = whisper_onnx[0].artifact
    engines = {"artifact": {"ttft_s": 0.003, "prefill_tokens_per_s": 9000.0,
                            "decode_tokens_per_s": 1800.0, "peak_rss_mb": 350.0},
               "hf-eager": {"ttft_s": 0.045, "prefill_tokens_per_s": 700.0,
                            "decode_tokens_per_s": 480.0}}
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"artifact": str(artifact), "device": "cpu", "dtype": "fp32",
                                 "prompt_tokens": 32, "new_tokens": 33, "runs": 2,
                                 "threads": 2, "engines": engines,
                                 "ratios": {"artifact/hf-eager": 1800 / 480}}))
    out = tmp_path / "r.html"
    write_report([artifact], out, [bench])
    text = _text(out.read_text())
    assert "Generation speed" in text and "1800.0" in text and "3.8x faster" in text
    write_report([artifact, artifact], out, [bench, bench])  # side by side: per token
    assert "0.5556 ms" in _text(out.read_text())
