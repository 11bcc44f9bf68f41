"""ONNX Runtime execution providers by short name ('cpu', 'cuda', ...): the one place
that knows them (the onnx target's ``ep`` option and its lowering), and what they lack."""

from __future__ import annotations

from targets.errors import TargetOptionError

PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "qnn": "QNNExecutionProvider",
}


def provider_names(csv: str) -> list[str]:
    """'cpu,cuda' -> ['CPUExecutionProvider', 'CUDAExecutionProvider'].

    Full ORT names ending in ExecutionProvider pass through, so providers this
    table does not know (a vendor's build) can still be asked for."""
    names = []
    for raw in csv.split(","):
        item = raw.strip()
        if not item:
            continue
        if item.lower() in PROVIDERS:
            names.append(PROVIDERS[item.lower()])
        elif item.endswith("ExecutionProvider"):
            names.append(item)
        else:
            raise TargetOptionError(
                f"unknown ONNX Runtime execution provider '{item}'", where="providers option",
                hint=f"use one of {', '.join(PROVIDERS)} or a full name such as "
                     "'DmlExecutionProvider'")
    if not names:
        raise TargetOptionError("the providers option names no execution provider",
                                where="providers option", hint="e.g. providers='cpu'")
    return names


def _requested_providers(value) -> list[str]:
    if value is None:
        return ["CPUExecutionProvider"]
    if isinstance(value, str):
        return provider_names(value)
    return provider_names(",".join(str(v) for v in value))


def refuse_bf16_on_cpu_only(dtype: str, providers: list[str]) -> None:
    """ONNX Runtime's CPU provider has no bfloat16 kernel for most ops (Mul, MatMul, ...):
    every op ran on the CPU fallback, a build that passed and ran as slowly as eager."""
    if dtype == "bf16" and providers == ["CPUExecutionProvider"]:
        raise TargetOptionError("--dtype bf16 on target onnx needs an execution provider with "
                                "bfloat16 kernels: ONNX Runtime's CPU provider has none for "
                                "most ops", hint="use --dtype fp16 or fp32 (or --quantize "
                                "int8-weight / int4-weight), --ep cuda,cpu on an NVIDIA GPU, "
                                "or --target cpu for bf16")
