"""A validation that cannot tell an output from a constant says so (exporter/validation/
validate.py, constant_passes): eager's reference near zero, or one value within the allowed
error, means an artifact returning zeros or that constant passes too. The build still
succeeds (the artifact may well be right); the warning is in its output and its manifest."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from exporter.validation.gates import QuantGate, Tolerance
from exporter.validation.validate import constant_passes, constant_warning
from runtime import read_manifest

FP32 = Tolerance.for_dtype("fp32")


def _found(*outputs: list[torch.Tensor], gate=FP32) -> dict[str, str]:
    """constant_passes over cases of outputs (float64 reference = the values themselves)."""
    names = [f"y{i}" for i in range(len(outputs[0]))]
    signature = SimpleNamespace(outputs=[SimpleNamespace(name=n) for n in names])
    references = [([t.float() if t.is_floating_point() else t for t in case], case, None)
                  for case in outputs]
    return constant_passes(signature, references, [gate] * len(references))


def test_near_zero_and_near_constant_outputs_are_found_and_healthy_ones_are_not():
    gen = torch.Generator().manual_seed(0)
    healthy = torch.randn(2, 10, generator=gen, dtype=torch.float64)
    vanished = 1e-27 * torch.randn(2, 10, generator=gen, dtype=torch.float64)
    flat = 0.5 + 1e-9 * torch.randn(8, 4, generator=gen, dtype=torch.float64)  # sigmoid(~0)
    found = _found([healthy, vanished, flat, torch.arange(6)])
    assert list(found) == ["y1", "y2"]
    assert "zeros would pass" in found["y1"] and "one constant would pass" in found["y2"]


def test_a_single_value_is_only_found_near_zero_and_cases_that_differ_count():
    assert _found([torch.tensor([2.5], dtype=torch.float64)]) == {}
    assert list(_found([torch.tensor([3e-9], dtype=torch.float64)])) == ["y0"]
    one = torch.full((4,), 0.25, dtype=torch.float64)
    assert list(_found([one], [one])) == ["y0"], "the same constant in every case"
    assert _found([one], [one + 1]) == {}, "a constant per case, but they differ"


def test_the_quantized_gate_is_asked_too():
    gate = QuantGate(min_sqnr_db=20.0, min_cosine=0.99, recipe="int8-dynamic")
    tiny = 1e-27 * torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    assert _found([tiny], gate=gate) == {}, "SQNR is scale-free: zeros fail it"
    assert list(_found([torch.full((4, 8), 3.0) + 1e-6], gate=gate)) == ["y0"]


def test_the_warning_names_three_outputs_and_counts_the_rest():
    text = constant_warning({f"o{i}": f"o{i} (...)" for i in range(5)})
    assert text.startswith("validation cannot tell 5 output(s) from a constant")
    assert "would pass as well: o0 (...); o1 (...); o2 (...); and 2 more." in text
    assert "o3" not in text


MODEL = '''
import torch

class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(8, 8)
        self.faint = torch.nn.Linear(8, 4)
        with torch.no_grad():
            self.faint.weight.mul_(1e-9)
            self.faint.bias.zero_()

    def forward(self, x):
        h = torch.relu(self.body(x))
        return h, self.faint(h)

def factory():
    torch.manual_seed(0)
    return TwoHeads(), (torch.randn(2, 8),)
'''


def test_a_build_whose_output_vanished_passes_and_warns_in_output_and_manifest(tmp_path,
                                                                                cli_here):
    (tmp_path / "faint.py").write_text(MODEL)
    out = tmp_path / "faint.artifact"
    done = cli_here("build", f"{tmp_path / 'faint.py'}:factory", "--target", "onnx",
                    "--out", out)
    assert done.returncode == 0, done.output
    warning = done.stderr[done.stderr.index("validation cannot tell"):]
    assert "1 output(s) from a constant" in warning and "would pass as well: output_1 (" in warning
    assert "zeros would pass" in warning and "output_0" not in warning
    record = read_manifest(out).validation
    assert record["passed"] and record["constant_would_pass"] == ["output_1"]
    assert any("from a constant" in w for w in record["warnings"])
