"""ONNX Runtime execution providers by short name ('cpu', 'cuda', ...): the one place
that knows them (the onnx target's ``ep`` option and its lowering)."""

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
