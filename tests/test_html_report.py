"""`exporter report ARTIFACT --html FILE`: one self-contained page, checked as text and in a
real headless browser (Debian's Chromium driven by Playwright: no script errors, the op
table's filter works, and a full-page screenshot shows the placement colours)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from exporter.report.charts import placement_colour
from exporter.validation.gates import ERROR_BINS

pytest.importorskip("onnxruntime")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Without these Chromium keeps calling Google's hosts, which this machine's network refuses.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]


@pytest.fixture(scope="module")
def page(custom_onnx, custom_bench, cli, tmp_path_factory):
    """The report of the custom-op onnx artifact (ORT, CPU fallback, ORT), with a real
    `exporter bench --json` result for the latency bars."""
    artifact, _ = custom_onnx
    scratch = tmp_path_factory.mktemp("report")
    (scratch / "bench.json").write_text(json.dumps(custom_bench))
    html = scratch / "report.html"
    result = cli("report", str(artifact), "--html", str(html), "--bench",
                 str(scratch / "bench.json"), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["html"] == str(html)
    return html, custom_bench


def _report_data(text: str) -> dict:
    raw = re.search(r'<script id="report-data" type="application/json">(.*?)</script>', text,
                    re.S).group(1)
    return json.loads(raw)


def test_page_has_every_section_and_loads_nothing(page):
    html, _ = page
    text = html.read_text()
    for section in ("signature", "placement", "validation", "latency", "memory", "passes"):
        assert f'<section id="{section}">' in text
    assert "default-src 'none'" in text  # the browser itself refuses any outside load
    assert not re.search(r'(src|href)\s*=\s*"(?!#)', text), "a resource outside the page"
    assert "batch[1..16]" in text  # the dynamic batch of the signature
    ops = _report_data(text)["coverage"]
    assert [o["op"] for o in ops if o["backend"] == "torch"] == ["edgetest.soft_clip.default"]


def test_page_figures_come_from_the_artifact_and_the_bench(page, custom_onnx):
    import runtime
    html, timed = page
    text = html.read_text()
    manifest = runtime.read_manifest(custom_onnx[0])
    rows = manifest.validation["outputs"]
    # the histogram counts every compared element: batch sizes of the cases x 8 outputs
    elements = sum(c["shapes"]["x"][0] * 8 for c in manifest.validation["cases"])
    assert sum(sum(r["abs_err_histogram"].values()) for r in rows) == elements
    assert set(rows[0]["abs_err_histogram"]) == set(ERROR_BINS)
    assert text.count('class="bin"') == len(ERROR_BINS)  # one output: one histogram
    assert text.count('class="bar"') == len(timed["timings"]) == 2  # artifact, eager
    assert f"median {timed['timings']['artifact']['median_ms']:.4f} ms" in text
    assert text.count('class="partition"') == len(manifest.partitions) + 2  # + inputs, outputs
    assert text.count('class="op"') == len(manifest.coverage)
    assert placement_colour("torch", "cpu") in text and placement_colour("onnxruntime", "cpu") in text


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (make test installs Debian's)")
def test_page_renders_in_headless_chromium_without_errors(page, tmp_path):
    from playwright.sync_api import sync_playwright

    html, _ = page
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1200, "height": 900})
            tab.on("pageerror", lambda exc: problems.append(f"script error: {exc}"))
            tab.on("console", lambda msg: problems.append(f"console {msg.type}: {msg.text}")
                   if msg.type in ("error", "warning") else None)
            tab.on("requestfailed", lambda req: problems.append(f"request: {req.url}"))
            tab.goto(html.as_uri())
            assert tab.evaluate("document.documentElement.dataset.rendered") == "yes"
            assert tab.evaluate("document.documentElement.dataset.errors") == "0"
            assert tab.locator("#ops tbody tr").count() == 4
            tab.fill("#op-filter", "soft_clip")  # the op table's filter runs in the page
            assert tab.locator("#ops tbody tr").count() == 1
            assert tab.inner_text("#op-count") == "1 of 4 ops"
            tab.fill("#op-filter", "")
            shot = tmp_path / "report.png"
            tab.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert problems == []
    print(f"screenshot: {shot}")
    _assert_screenshot_shows_placement(shot)


def _assert_screenshot_shows_placement(shot: Path) -> None:
    """The screenshot test: a full page (not a blank or clipped one) in which the
    partition graph's colours for ONNX Runtime and for the CPU fallback are drawn."""
    from matplotlib import image

    pixels = (image.imread(shot)[..., :3] * 255).round().astype(int)
    height, width, _ = pixels.shape
    assert width == 1200 and height > 1500, (width, height)
    colours = {tuple(int(h[i:i + 2], 16) for i in (1, 3, 5)) for h in
               (placement_colour("onnxruntime", "cpu"), placement_colour("torch", "cpu"))}
    for colour in colours:
        count = int((pixels == colour).all(axis=-1).sum())
        assert count > 2000, f"colour {colour}: {count} pixels"  # boxes, chips, squares


def test_report_bad_inputs_exit_2_and_write_nothing(custom_onnx, cli, tmp_path):
    artifact, _ = custom_onnx
    bench = tmp_path / "bench.json"
    bench.write_text('{"timings": {"artifact": {"median": 1}}}')
    out = tmp_path / "r.html"
    wrong = cli("report", str(artifact), "--html", str(out), "--bench", str(bench))
    assert wrong.returncode == 2 and "bench.json" in wrong.stderr
    assert "exporter bench ARTIFACT --json" in wrong.stderr and "Traceback" not in wrong.stderr
    nowhere = cli("report", str(artifact), "--html", str(tmp_path / "no" / "r.html"))
    assert nowhere.returncode == 2 and "does not exist" in nowhere.stderr
    assert list(tmp_path.iterdir()) == [bench]


def test_a_long_partition_chain_starts_folded_and_stays_narrow(custom_onnx):
    """Forty partitions alternating between ORT and the CPU fallback: the graph is folded
    behind a summary and its arcs do not widen the page past ~1100 px."""
    import dataclasses

    import runtime
    from exporter.report import html as html_report
    from runtime.manifest import Partition

    manifest = runtime.read_manifest(custom_onnx[0])
    first = manifest.signature.inputs[0].name
    chain = [Partition(name=f"p{i}", backend=("onnxruntime", "torch")[i % 2], device="cpu",
                       files=(), inputs=(f"t{i - 1}" if i else first, first),
                       outputs=(f"t{i}",)) for i in range(40)]
    page = html_report.render(dataclasses.replace(manifest, partitions=tuple(chain)),
                              artifact_name="chain.artifact", size=1, signature=None, bench=None)
    folded = re.search(r'<details id="graph-details"([^>]*)><summary>the partition graph '
                       r"\(40 partitions\)</summary><svg[^>]*width=\"(\d+)\"", page)
    assert folded, "the graph is not folded behind its summary"
    print(f"40-partition graph: folded, {folded.group(2)} px wide")
    assert "open" not in folded.group(1) and int(folded.group(2)) <= 1100
    assert page.count('class="partition"') == 42  # inputs, 40 partitions, outputs
