"""One typed settings object for a build, with every default in one place.

The CLI only fills this in and calls ``exporter.build``; tests and the Python
API call the same function (modelled on Torch-TensorRT's ``_settings.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ARTIFACT_SUFFIX = ".artifact"


class BuildSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str = "cpu"
    out: Path | None = Field(None, description="artifact path; default <model>-<target>.artifact")
    dynamic: list[str] = Field(default_factory=list, description="INPUT:DIM=MIN..MAX entries")
    inputs: Path | None = Field(None, description=".npz of representative inputs to validate on")
    validate_artifact: bool = True
    keep_failed: bool = False
    cpu_isa: Literal["auto", "avx512", "avx2", "generic"] = "auto"  # see targets.cpu_isa
    dtype: Literal["fp32", "fp16", "bf16"] = "fp32"
    autotune: bool = False
    fallback: Literal["allow", "warn", "forbid"] = "warn"
    min_partition_size: int = Field(1, ge=1)
    ep: str = Field("cpu", description="ONNX Runtime execution providers, in order")
    tvm_target: str | None = Field(None, description="TVM target string; default LLVM for "
                                                     "the --cpu-isa level")
    tune: int = Field(0, ge=0, description="tvm: MetaSchedule trials (0 = untuned schedules)")
    fuse: bool = Field(True, description="the target's graph fusion passes (targets.fusion)")
    quantize: Literal["int8-dynamic", "int8-static", "int8-weight", "int4-weight"] | None = None
    calibration: str | None = Field(None, description="int8-static: .npz of representative "
                                                      "inputs, or 'random' (warned)")
    # The accuracy gate of quantized builds: an output passes with either figure.
    quant_min_sqnr_db: float = 20.0
    quant_min_cosine: float = 0.99
    seed: int = 0
    validation_timeout_s: float = Field(900.0, gt=0, allow_inf_nan=False, description="seconds "
                                        "the validation subprocess may take")
    memory_budget: int | None = Field(None, gt=0, description="bytes (or a size: 64MB, 1.5GiB) "
                                      "that weights plus planned activations must fit in")

    task: Literal["feature-extraction", "text-classification", "causal-lm",
                  "image-classification"] | None = Field(None, description="hf: specs: the "
                                                         "model class (default: from the "
                                                         "config's architectures)")
    seq_len: int | None = Field(None, gt=0, description="hf: text models' example length")
    image_size: int | None = Field(None, gt=0, description="hf: image models' example size")
    random_weights: bool = Field(False, description="hf: build even where the checkpoint "
                                 "lacks weights (random, warned); refused otherwise")
    trust_remote_code: bool = Field(False, description="hf: let a checkpoint's own Python "
                                    "code (config.json auto_map) run; refused otherwise")
    max_model_size: int | None = Field(None, gt=0, description="hf: refuse a config whose "
                                       "float32 weights exceed this size (default: half this "
                                       "machine's memory)")
    compile_timeout_s: int = Field(1800, ge=0, description="cpu, cuda: seconds one C++ "
                                   "compiler run may take (0: no limit)")
    deterministic: bool = Field(False, description="turn off what makes builds differ "
                                "(on-device kernel timing); refuses --autotune and --tune")

    @model_validator(mode="after")
    def _deterministic_excludes_tuning(self) -> "BuildSettings":
        if self.deterministic and (self.autotune or self.tune):
            raise ValueError("--deterministic cannot be combined with --autotune or --tune, "
                             "which keep what measured fastest on this machine")
        return self

    @field_validator("memory_budget", "max_model_size", mode="before")
    @classmethod
    def _parse_size(cls, value: object) -> object:
        return parse_size(value) if isinstance(value, str) else value

    def providers(self) -> list[str]:
        from targets.onnx import provider_names  # the one place that knows EP names
        return provider_names(self.ep)

    def output_path(self, model_name: str) -> Path:
        if self.out is not None:
            return self.out
        return Path(f"{model_name}-{self.target}{ARTIFACT_SUFFIX}")


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20,
          "gib": 2**30}


def parse_size(text: str) -> int:
    """``"512MB"``, ``"1.5GiB"``, ``"4096"`` -> bytes (decimal and binary units)."""
    number = text.strip().rstrip("bBiIkKmMgG")
    unit = text.strip()[len(number):].lower()
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or value <= 0:
        raise ValueError(f"'{text}' is not a size; write e.g. 4096, 64MB, 512MiB or 1.5GB")
    return int(value * _UNITS[unit])
