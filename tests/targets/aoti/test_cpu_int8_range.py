"""The cpu target's PT2E recipes keep activations to 7 bits on x86: without VNNI (AVX2
alone) oneDNN's u8s8 kernels sum pairs of products in 16 bits with saturation, and the zoo
encoder's int8-dynamic build missed the gate at 15.6 dB (33.7 dB with 7 bits; the end-to-end
build is tests/passes/test_quantize.py's encoder test). No x86-64 level requires VNNI, so
every x86 artifact keeps to 7 bits; an aarch64 build keeps the full range."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchao")


def _quantized(recipe: str, calibration: list):
    from passes.quantize.quantize import QuantizePT2E
    from targets.registry import get_target
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 8)).eval()
    program = torch.export.export(model, (torch.randn(4, 16),))
    quantization = get_target("cpu").quantization
    return QuantizePT2E(recipe, lambda: quantization.quantizer(recipe), calibration,
                        "test", quantization.record(recipe))(program)


def _activation_ranges(graph) -> set[int]:
    """quant_max of every per-tensor (activation) quantize in the converted graph."""
    ranges = set()
    for node in graph.nodes:
        name = str(node.target)
        if node.op == "call_function" and "quantize_per_tensor" in name \
                and "dequantize" not in name:
            ranges.add(int(node.args[4]))
    return ranges


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_int8_static_activation_range_follows_the_machine(machine, monkeypatch):
    import targets.aoti.cpu as cpu
    monkeypatch.setattr(cpu.platform, "machine", lambda: machine)
    calibration = [[torch.randn(4, 16) * 3] for _ in range(4)]
    result = _quantized("int8-static", calibration)
    bits = 7 if machine == "x86_64" else 8
    assert result.info["activation_bits"] == bits
    assert _activation_ranges(result.program.graph) == {2 ** bits - 1}


def test_int8_dynamic_quantizer_keeps_activations_to_seven_bits_on_x86(monkeypatch):
    import targets.aoti.cpu as cpu
    monkeypatch.setattr(cpu.platform, "machine", lambda: "x86_64")
    spec = cpu.CpuTarget.quantization.quantizer("int8-dynamic").global_config.input_activation
    assert (spec.quant_min, spec.quant_max, spec.is_dynamic) == (0, 127, True)


def test_an_int8_dynamic_cpu_build_passes_on_no_warning_of_inductors_own(tmp_path):
    """Inductor's oneDNN int8 lowering warns about its own ``torch.tensor(tensor)``: the
    CLI printed it as a user's warning on every int8-dynamic cpu build (zoo:mlp included)."""
    import warnings

    import exporter
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        exporter.build("zoo:mlp", target="cpu", quantize="int8-dynamic", cpu_backend="aoti",
                       out=tmp_path / "mlp.artifact", validate_artifact=False)
    assert not [w for w in seen if "copy construct" in str(w.message)]
