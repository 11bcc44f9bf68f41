"""`exporter report ARTIFACT --html FILE`: one self-contained page, checked as text and in a
real headless browser (Debian's Chromium driven by Playwright: no script errors, the op
table's filter works, the latency axis is labelled and each median mark sits where its
value falls on it, and a full-page screenshot shows the placement colours); and
`exporter report A B --html FILE`, two builds of one model side by side."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from exporter.report.charts import placement_colour
from exporter.report.html import write_report
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
    for section in ("signature", "placement", "validation", "latency", "layers",
                    "quantization", "graphs", "memory", "passes"):
        assert f'<section id="{section}">' in text
    assert "default-src 'none'" in text  # the browser itself refuses any outside load
    assert not re.search(r'(src|href)\s*=\s*"(?!#)', text), "a resource outside the page"
    assert "batch[1..16]" in text  # the dynamic batch of the signature
    ops = _report_data(text)["coverage"]
    assert [o["op"] for o in ops if o["backend"] == "torch"] == ["edgetest.soft_clip.default"]
    assert "`" not in re.sub(r"<script.*?</script>", "", text, flags=re.S)  # prose, not markdown


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
    assert text.count('class="median"') == 2 and text.count('class="whisker"') == 2
    assert f"median {timed['timings']['artifact']['median_ms']:.4f} ms" in text
    assert "latency per call (ms)" in text and timed["machine"]["cpu"] in text
    assert f"x: float32{timed['inputs'][0]['shape']}" in text  # the shapes it was timed at
    assert text.count('class="partition"') == len(manifest.partitions) + 2  # + inputs, outputs
    assert text.count('class="op"') == len(manifest.coverage)
    assert placement_colour("torch", "cpu") in text and placement_colour("onnxruntime", "cpu") in text
    # time per partition: one row each, plus the runtime around them
    times = re.search(r'<table class="partition-times">.*?</table>', text, re.S).group(0)
    assert times.count("<tr>") == 1 + len(manifest.partitions) + 1
    # FLOPs per layer: the two linears (16->32 and 32->8) at the example batch of 2
    flops = {r["node"]: r["flops"] for r in manifest.coverage}
    assert flops == {"linear": 2 * 2 * 16 * 32, "relu": 0, "soft_clip": 0,
                     "linear_1": 2 * 2 * 32 * 8}
    assert {r["node"]: r["weight_bytes"] for r in manifest.coverage if r["weight_bytes"]} == \
        {"linear": (32 * 16 + 32) * 4, "linear_1": (8 * 32 + 8) * 4}
    assert "3.07 kFLOP per call in total" in text
    # each partition's own graph: ONNX nodes for ORT, the ATen JSON for the fallback
    views = dict(re.findall(r'<details class="graph-view" data-partition="(\w+)">(.*?)</details>',
                            text, re.S))
    assert set(views) == {"p0", "p1", "p2"}
    assert ">Gemm<" in views["p0"] and ">Relu<" in views["p0"] and "<i>from</i> linear" in views["p0"]
    assert ">edgetest.soft_clip.default<" in views["p1"] and "float[" in views["p1"]
    assert '<a href="#g-p0-0">node_linear</a>' in views["p0"]  # Relu reads Gemm's output


NO_CHROMIUM = pytest.mark.skipif(CHROMIUM is None,
                                 reason="no chromium here (make test installs Debian's)")


def _in_chromium(html: Path, check) -> list[str]:
    """Open the page in headless Chromium, run ``check(tab)``; the problems the browser
    reported (script errors, console errors and warnings, requests)."""
    from playwright.sync_api import sync_playwright

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
            check(tab)
        finally:
            browser.close()
    return problems


_LATENCY_AS_DRAWN = """() => {
  const box = document.querySelector('.latency');
  const svg = box.querySelector('svg').getBoundingClientRect();
  const mark = (r) => { const b = r.getBoundingClientRect();
    return {ms: Number(r.dataset.medianMs), x: b.x + b.width / 2 - svg.x, width: b.width,
            height: b.height}; };
  return {end: Number(box.dataset.axisMaxMs), left: Number(box.dataset.plotLeft),
          width: Number(box.dataset.plotWidth),
          ticks: [...box.querySelectorAll('text.tick')].map((t) => t.textContent),
          title: box.querySelector('text.axis-title').textContent,
          medians: [...box.querySelectorAll('rect.median')].map(mark)};
}"""


def _assert_latency_axis(tab, runners: int) -> None:
    """The axis starts at 0, is labelled in ms, and every median mark is drawn (a few px
    wide) where its value falls on the axis; the largest median is no tick at the left."""
    drawn = tab.evaluate(_LATENCY_AS_DRAWN)
    assert drawn["title"] == "latency per call (ms)"
    assert drawn["ticks"][0] == "0" and len(drawn["ticks"]) >= 3
    assert float(drawn["ticks"][-1]) == pytest.approx(drawn["end"])
    assert len(drawn["medians"]) == runners
    for mark in drawn["medians"]:
        assert mark["width"] >= 2 and mark["height"] >= 20, mark
        assert mark["ms"] <= drawn["end"]  # a median is never off the axis
        want = drawn["left"] + mark["ms"] / drawn["end"] * drawn["width"]
        assert abs(mark["x"] - want) <= 1.5, (mark, want)
    largest = max(m["x"] for m in drawn["medians"]) - drawn["left"]
    assert largest >= drawn["width"] / 5, "the medians are squeezed against the axis origin"


@NO_CHROMIUM
def test_page_renders_in_headless_chromium_without_errors(page, tmp_path):
    html, timed = page
    shot = tmp_path / "report.png"

    def check(tab):
        assert tab.locator("#ops tbody tr").count() == 4
        tab.fill("#op-filter", "soft_clip")  # the op table's filter runs in the page
        assert tab.locator("#ops tbody tr").count() == 1
        assert tab.inner_text("#op-count") == "1 of 4 ops"
        tab.fill("#op-filter", "")
        _assert_latency_axis(tab, len(timed["timings"]))
        tab.click('details[data-partition="p0"] summary')  # the graph view opens
        assert tab.locator('details[data-partition="p0"] table.graph tbody tr').count() == 2
        tab.screenshot(path=str(shot), full_page=True)

    assert _in_chromium(html, check) == []
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


def test_report_bad_inputs_exit_2_and_write_nothing(custom_onnx, cli_here, tmp_path):
    artifact, cli = custom_onnx[0], cli_here  # the page fixture runs the command's process
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
    from runtime.format.manifest import Partition

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
    assert "open" not in folded.group(1) and int(folded.group(2)) <= 1100
    assert page.count('class="partition"') == 42  # inputs, 40 partitions, outputs


def test_a_noisy_machine_keeps_the_medians_readable():
    """One slow call in a hundred (p90 100x the median) must not squeeze the medians into
    ticks: the axis ends near the medians, the whisker is cut with an arrow and its value
    printed."""
    from exporter.report.charts import latency_chart, nice_axis

    chart = latency_chart({"artifact": {"median_ms": 0.05, "p10_ms": 0.04, "p90_ms": 5.0},
                           "eager": {"median_ms": 0.2, "p10_ms": 0.15, "p90_ms": 0.3}}, "t")
    end = float(re.search(r'data-axis-max-ms="([^"]+)"', chart).group(1))
    assert 0.2 < end <= 0.6 and nice_axis(0.6) == (0.6, 0.2)
    widths = [float(w) for w in re.findall(r'class="bar" x="[^"]+" y="[^"]+" width="([^"]+)"',
                                           chart)]
    assert widths[1] / 470 == pytest.approx(0.2 / end, abs=0.01) and widths[0] > 20
    assert chart.count('class="off-scale"') == 1 and "p90 5, off the axis" in chart


def test_bench_times_each_partition_and_each_onnx_node(custom_bench, custom_onnx):
    """`exporter bench` times each partition inside the runtime and asks ONNX Runtime's
    profiler for its nodes; the machine and input shapes come with them."""
    import runtime

    manifest = runtime.read_manifest(custom_onnx[0])
    parts = custom_bench["partitions"]
    assert list(parts) == [p.name for p in manifest.partitions]
    for name, timing in parts.items():
        assert 0 < timing["p10_ms"] <= timing["median_ms"] <= timing["p90_ms"], name
        assert timing["runs"] == custom_bench["runs"]
    assert parts["p1"]["backend"] == "torch"
    assert set(custom_bench["ops"]) == {"p0", "p2"}  # ORT partitions only
    assert [r["node"] for r in custom_bench["ops"]["p2"]] == ["node_linear"]
    assert custom_bench["ops"]["p2"][0]["calls"] == custom_bench["runs"]
    host = custom_bench["machine"]
    assert host["threads"]["torch"] >= 1 and host["versions"]["onnxruntime"]
    assert custom_bench["inputs"] == [{"name": "x", "dtype": "float32", "shape": [2, 16]}]


@pytest.fixture(scope="module")
def mlp_int8(artifacts_dir):
    """zoo:mlp on onnx quantized by ONNX Runtime (int8-dynamic): the fp32 build's twin
    (built in this process, as onnx_mlp is: no second interpreter start-up)."""
    import exporter
    return exporter.build("zoo:mlp", target="onnx", quantize="int8-dynamic",
                          out=artifacts_dir / "mlp-onnx-int8.artifact").artifact


@pytest.fixture(scope="module")
def comparison(onnx_mlp, mlp_int8, cli_here, tmp_path_factory):
    """The fp32 and int8 builds of zoo:mlp, each benched (exporter.bench, in this process:
    the CLI's bench is test_bench_cpu's), on one comparison page."""
    from exporter.benchmark import bench

    scratch = tmp_path_factory.mktemp("compare")
    benches = []
    for artifact in (onnx_mlp, mlp_int8):
        benches.append(scratch / f"{artifact.stem}.json")
        benches[-1].write_text(json.dumps(bench(artifact, baselines=("eager",), runs=10,
                                                warmup=2)))
    html = scratch / "cmp.html"
    made = cli_here("report", str(onnx_mlp), str(mlp_int8), "--html", str(html), "--bench",
                    str(benches[1]), "--bench", str(benches[0]), "--json")  # any order
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["artifacts"] == [str(onnx_mlp), str(mlp_int8)]
    return html, [json.loads(b.read_text()) for b in benches]


def test_comparison_puts_two_builds_side_by_side(comparison, onnx_mlp, mlp_int8):
    html, (fp32_bench, int8_bench) = comparison
    text = html.read_text()
    rows = _report_data(text)["artifacts"]
    assert [r["kind"] for r in rows] == ["fp32, float", "fp32, int8-dynamic"]
    assert [r["size_bytes"] for r in rows] == [onnx_mlp.stat().st_size, mlp_int8.stat().st_size]
    assert [r["median_ms"] for r in rows] == [fp32_bench["timings"]["artifact"]["median_ms"],
                                              int8_bench["timings"]["artifact"]["median_ms"]]
    assert rows[0]["error_rank"] < rows[1]["error_rank"]  # int8 is further from eager
    assert "worst SQNR" in rows[1]["validation"] and "allowance" in rows[0]["validation"]
    best = re.findall(r'<span class="best">([^<]+)</span>', text)
    assert f"{rows[1]['size_bytes'] / 1e6:.3f} MB" in best  # int8: the smaller file
    assert rows[0]["error_decade"] in best  # fp32: the smaller error
    assert len(best) == 3 and text.count('class="median"') == 2


@NO_CHROMIUM
def test_comparison_renders_with_its_latency_axis(comparison):
    html, _ = comparison

    def check(tab):
        assert tab.locator("table.compare tbody tr").count() == 2
        _assert_latency_axis(tab, 2)

    assert _in_chromium(html, check) == []


def test_int8_report_shows_each_layers_error(mlp_int8, tmp_path):
    """ORT's int8-dynamic build: each quantized layer's SQNR against the float model,
    as the manifest records it, on the page."""
    import runtime

    record = runtime.read_manifest(mlp_int8).partitions[0].meta["quantization"]
    # named by the module each came from, as the cpu target's PT2E report names them
    assert record["layers_quantized"] == ["fc1:node_linear", "fc2:node_linear_1",
                                          "fc3:node_linear_2"]
    errors = record["layer_errors"]
    assert [r["layer"] for r in errors] == record["layers_quantized"]
    assert all(r["sqnr_db"] > 20 and r["cosine"] > 0.99 for r in errors), errors
    out = tmp_path / "int8.html"
    write_report([mlp_int8], out)
    table = re.search(r'<table class="quant-errors">.*?</table>', out.read_text(), re.S).group(0)
    assert table.count("<tr>") == 1 + 3
    assert all(f"{r['sqnr_db']:.2f} dB" in table for r in errors)


def test_report_of_different_models_or_a_stray_bench_is_refused(custom_onnx, onnx_mlp,
                                                                 custom_bench, tmp_path):
    """(The CLI turns these UserInputErrors into exit 2: test_report_bad_inputs_exit_2...)"""
    from exporter.errors import UserInputError

    out = tmp_path / "cmp.html"
    with pytest.raises(UserInputError, match="different models"):
        write_report([custom_onnx[0], onnx_mlp], out)
    stray = tmp_path / "bench.json"
    stray.write_text(json.dumps(custom_bench))
    with pytest.raises(UserInputError, match="not among the artifacts"):
        write_report([onnx_mlp, onnx_mlp], out, [stray])
    assert not out.exists()


def test_pt2e_records_each_quantized_layers_error():
    """The PT2E pass (the cpu target's int8-dynamic) measures each layer it quantized
    against the float program on the same inputs; no compile needed to check that."""
    import torch

    from exporter.model.spec import load_spec
    from targets import LowerOptions, get_target

    spec = load_spec("zoo:mlp")
    program = torch.export.export(spec.module, tuple(spec.args), spec.kwargs)
    cpu = get_target("cpu")
    quantize = cpu.quantization.quantize_pass(
        LowerOptions(work_dir=Path("."), quantize="int8-dynamic"), cpu.device)
    info = quantize(program).info
    assert info["layer_errors_on"] == "the example inputs"
    assert [r["layer"] for r in info["layer_errors"]] == info["layers_quantized"] == \
        ["fc1:linear", "fc2:linear_1", "fc3:linear_2"]
    assert all(25 < r["sqnr_db"] < 80 and 0.99 < r["cosine"] < 1 for r in info["layer_errors"])
