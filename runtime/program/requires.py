"""What an artifact needs installed to run: torch only where a partition needs it.

A kind whose executor declares ``arrays = True`` (ONNX Runtime, TVM) runs on numpy arrays
on the CPU (its executor takes and gives them when torch is missing), so a device that runs
only those needs their own library and numpy, about a tenth of a torch install.
AOTInductor and CPU-fallback partitions are torch code; CUDA partitions use torch for
devices, copies and graphs; a kind that declares nothing is handed torch tensors
(runtime/executors/base.py); and an input or output of a dtype numpy lacks (bfloat16) can
only be a tensor. ``runtime.load`` asks
this before it loads anything, and ``exporter package`` locks exactly these packages.
"""

from __future__ import annotations

from runtime.errors import CompatibilityError
from runtime.executors import array_packages, holds_native_code
from runtime.format.dtypes import NUMPY_TWINS
from runtime.format.manifest import Manifest, Partition
from runtime.host.platforms import NAMES as PLATFORMS

# What the runtime imports when torch is in use (runtime/format/weights.py, tensorio.py).
TORCH_STACK = ("torch", "numpy", "safetensors")


def why_torch(partition: Partition) -> str | None:
    """Why this partition needs torch at run time, or None when numpy arrays do."""
    if array_packages(partition) is None:
        return f"partition '{partition.name}' runs on {partition.backend}"
    if partition.device != "cpu":
        return f"partition '{partition.name}' runs on {partition.device}"
    return None


def torch_reasons(manifest: Manifest) -> list[str]:
    """One line per partition (or input, output) that needs torch; empty: numpy arrays
    run the artifact."""
    signature = manifest.signature
    reasons = [why for why in map(why_torch, manifest.all_partitions()) if why] + [
        f"{spec.name!r} is {spec.dtype}, which numpy does not hold"
        for spec in (*signature.inputs, *signature.outputs) if spec.dtype not in NUMPY_TWINS]
    if manifest.generation is not None:
        reasons.append("it generates text: the KV cache and the decode loop "
                       "(runtime/generation/) run on torch")
    if manifest.shared_weights:
        reasons.append("its partitions read one shared weight store, loaded with torch")
    return reasons


def packages(manifest: Manifest) -> tuple[str, ...]:
    """The distributions the runtime imports for this artifact, beyond each backend's own
    library: torch, numpy, safetensors when a partition needs torch (and tokenizers for a
    generating artifact that carries a tokenizer); else numpy and what the array kinds
    used need."""
    if torch_reasons(manifest):  # a generating artifact's text needs its tokenizer too
        text = manifest.generation is not None and manifest.generation.tokenizer
        return TORCH_STACK + (("tokenizers",) if text else ())
    extra = {dist for p in manifest.partitions for dist in array_packages(p) or ()}
    return ("numpy", *sorted(extra))


def torch_or_none(manifest: Manifest, *, where: str):
    """The torch module when it is installed (the program then takes and gives tensors, as
    it always has); None when it is not and no partition needs it (numpy arrays in and
    out); CompatibilityError naming the partitions when they need it and it is missing."""
    try:
        import torch
    except ImportError:
        reasons = torch_reasons(manifest)
        if reasons:
            raise CompatibilityError(
                "this artifact needs torch, which is not installed", where=where,
                details=reasons, hint=f"pip install torch=={manifest.requirements.torch.split('+')[0]}"
                " (the version it was built with), or install the bundle `exporter package` "
                "makes for it") from None
        return None
    return torch


def loads_on(manifest: Manifest) -> dict:
    """Where the artifact loads, judged as the loader judges it (runtime/format/
    consistency.py): on every platform its runtime runs on when no partition holds native
    code; else on its platform only, with the CPU instruction set and flags it needs."""
    req = manifest.requirements
    native = sorted({p.backend for p in manifest.all_partitions() if holds_native_code(p)})
    return {"any_platform": not native, "platforms": list(PLATFORMS) if not native
            else [req.platform_name], "native_code": native,
            "cpu_isa": req.cpu_isa if native else None,
            "cpu_flags": list(req.cpu_flags) if native else [],
            "cuda_capability": req.cuda_capability}
