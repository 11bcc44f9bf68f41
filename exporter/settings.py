"""One typed settings object for a build, with every default in one place.

The CLI only fills this in and calls ``exporter.build``; tests and the Python
API call the same function (modelled on Torch-TensorRT's ``_settings.py``).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from exporter.kinds import GENERATING, kind_name
from runtime.host.platforms import host_platform, unknown_platform
from targets.options import FallbackPolicy, TargetOptions
from targets.registry import described
from targets.options import flag_name
from targets.registry import DEFAULT_TARGET

ARTIFACT_SUFFIX = ".artifact"
# Where the artifact goes, not what it is: not in its manifest or a matrix cell's key
NOT_RECORDED = frozenset({"out", "force"})


class BuildSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str = Field(DEFAULT_TARGET, description="where the artifact runs (`exporter "
                        "targets` says which work here)")
    platform: str = Field(default_factory=host_platform, description="the OS and CPU the "
                          "artifact runs on (default: this machine's); docs/building.md "
                          "says which targets build for which")
    out: Path | None = Field(None, description="artifact path; default <file>-<target>"
                             ".artifact (<file>-<factory>-<target> for a specific factory "
                             "name)")
    force: bool = Field(False, description="replace an artifact at the output path that "
                        "another spec built (refused otherwise)")
    dynamic: list[str] = Field(default_factory=list, description="INPUT:DIM=MIN..MAX, "
                               "repeatable: a dynamic dimension and its bounds; batch=MIN..MAX "
                               "for dim 0 of every input (hf: also sequence=MIN..MAX)")
    inputs: Path | None = Field(None, description=".npz of representative inputs to validate on")
    validate_artifact: bool = Field(True, description="validate against eager PyTorch in a "
                                    "separate process (skipping it is not advised)")
    keep_failed: bool = Field(False, description="keep an artifact that fails validation, "
                              "renamed")
    cpu_isa: Literal["auto", "avx512", "avx2", "generic"] = Field(
        "auto", description="the CPU family the code is compiled for (targets/cpu_isa.py)")
    dtype: Literal["fp32", "fp16", "bf16"] = Field(
        "fp32", description="math precision (inputs and outputs keep their dtypes)")
    fallback: FallbackPolicy = Field(FallbackPolicy.WARN, description="ops no target claims "
                                     "run on the CPU fallback: allowed, warned, or refused")
    min_partition_size: int = Field(1, ge=1, description="smaller delegated islands stay on "
                                    "the CPU fallback")
    # The target's own options (its ``Options`` model, all fields filled in). Given flat
    # (``BuildSettings(target="tvm", tune=8)``, a flag, a config key) or as a table.
    target_options: dict[str, Any] = Field(default_factory=dict)
    fuse: bool = Field(True, description="graph fusion passes, for the targets that run them "
                       "(batch-norm folding, QKV merge, no-ops; targets/fusion.py)")
    quantize: Literal["int8-dynamic", "int8-static", "int8-weight", "int4-weight"] | None = Field(
        None, description="a quantization recipe (which targets run which: `exporter targets`)")
    calibration: str | None = Field(None, description="int8-static: .npz of representative "
                                                      "inputs, or 'random' (warned)")
    # The accuracy gate of quantized builds: an output passes with either figure.
    quant_min_sqnr_db: float = Field(20.0, description="quantized builds: per-output SQNR "
                                     "gate in dB (an output passes on SQNR or cosine)")
    quant_min_cosine: float = Field(0.99, description="quantized builds: per-output cosine gate")
    seed: int = Field(0, description="seed of the random validation inputs")
    # The generation gate of fp16/bf16 and quantized text-generation builds (exporter/lm/
    # gate.py): None takes the default for the build's kind.
    min_top1: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False,
                                   description="text-generation, "
                                   "fp16/bf16/quantized: least teacher-forced top-1 agreement "
                                   "with eager fp32 (default per kind: fp16 0.9 ... int4 0.7)")
    max_kl: float | None = Field(None, ge=0.0, allow_inf_nan=False, description="text-"
                                 "generation, fp16/bf16/quantized: largest mean KL divergence "
                                 "from eager fp32, nats (default per kind: fp16 0.02 ... "
                                 "int4 0.2)")
    validation_timeout_s: float = Field(900.0, gt=0, allow_inf_nan=False, description="seconds "
                                        "the validation subprocess may take")
    memory_budget: int | None = Field(None, gt=0, description="fail when weights plus planned "
                                      "activations exceed this size (bytes, or 64MB, 1.5GiB)")

    task: Literal["feature-extraction", "text-classification", "causal-lm",
                  "image-classification", "text-generation"] | None = Field(None, description="hf: specs: the "
                                                         "model class (default: from the "
                                                         "config's architectures)")
    seq_len: int | None = Field(None, gt=0, description="hf: text models' example length")
    batch_size: int | None = Field(None, gt=0, description="hf: the example inputs' batch "
                                   "(default 1; a dynamic batch: --dynamic batch=1..N)")
    max_context: int | None = Field(None, gt=1, description="text-generation: tokens the KV "
                                    "cache holds, prompt and generated (default: the model's "
                                    "positions, at most 2048)")
    prefill_chunk: int | None = Field(None, description="text-generation: the most "
                                      "prompt tokens one prefill step takes (default 256, at "
                                      "least 2); longer prompts go in chunks")
    max_source: int | None = Field(None, gt=0, description="text-generation, encoder-decoders "
                                   "with a text encoder: the longest source in tokens (the "
                                   "cross-attention cache's rows; default: the encoder's "
                                   "positions, at most 1024)")
    image_size: int | None = Field(None, gt=0, description="hf: image models' example size")
    random_weights: bool = Field(False, description="hf: build even where the checkpoint "
                                 "lacks weights (random, warned); refused otherwise")
    trust_remote_code: bool = Field(False, description="hf: let a checkpoint's own Python "
                                    "code (config.json auto_map) run; refused otherwise")
    max_model_size: int | None = Field(None, gt=0, description="hf: refuse a config whose "
                                       "float32 weights exceed this size (default: half this "
                                       "machine's memory)")
    deterministic: bool = Field(False, description="turn off what makes builds differ "
                                "(on-device kernel timing); refuses on-device tuning")

    @model_validator(mode="before")
    @classmethod
    def _gather_target_options(cls, data: Any) -> Any:
        """Flat target-option keys join ``target_options``; the table is validated by the
        target's ``Options`` and stored whole (defaults included), so the manifest and
        --save-config record every option the build used."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        table = dict(data.pop("target_options", None) or {})
        target = described().get(str(data.get("target", DEFAULT_TARGET)))
        if target is None:
            return {**data, "target_options": table}  # exporter.build says "unknown target"
        own = target.Options.model_fields
        for key in [k for k in data if k not in cls.model_fields]:
            value = data.pop(key)
            # another target's option at its default says nothing (old saved configs hold
            # every option); the rest go to the target's Options, which names the owner
            if key in own or not _is_default_elsewhere(key, value):
                table[key] = value
        try:
            options = target.Options(**table)
        except ValidationError as exc:
            raise ValueError("; ".join(_option_problem(e) for e in exc.errors())) from None
        return {**data, "target_options": options.model_dump(mode="json")}

    @model_validator(mode="after")
    def _generation_options_need_the_task(self) -> "BuildSettings":
        given = [flag for flag, value in (("--max-context", self.max_context),
                                          ("--prefill-chunk", self.prefill_chunk),
                                          ("--max-source", self.max_source)) if value is not None]
        if given and kind_name(self) != GENERATING:
            verb = "applies" if len(given) == 1 else "apply"
            task = f" for --task {self.task}" if self.task else ""
            raise ValueError(f"{', '.join(given)} {verb} to --task text-generation only (this "
                             f"build is a plain forward pass{task}); give --task "
                             "text-generation, or leave it out")
        return self

    @model_validator(mode="after")
    def _no_flag_that_does_nothing(self) -> "BuildSettings":
        recipe = f"--quantize {self.quantize}" if self.quantize else "a float build"
        unused = self.options().unused_with(self.quantize) if self.target in described() else []
        if unused:
            raise ValueError(f"{'; '.join(unused)} does nothing in {recipe}; leave it "
                             "out or give the recipe it applies to")
        problem = self._gate_bounds_without_their_gate()
        if problem:
            raise ValueError(problem)
        return self

    def _gate_bounds_without_their_gate(self) -> str | None:
        """The generation gate's bounds (--min-top1, --max-kl) judge fp16/bf16 and
        quantized text-generation builds; the output gate's (--min-sqnr, --min-cosine)
        quantized forward passes. Either given where the other, or none, judges: why."""
        generating = kind_name(self) == GENERATING
        top1 = [flag for flag, value in (("--min-top1", self.min_top1),
                                         ("--max-kl", self.max_kl)) if value is not None]
        if top1 and not (generating and (self.dtype != "fp32" or self.quantize)):
            build = ("an fp32 text-generation build, whose tokens must equal transformers' "
                     "exactly" if generating else "a plain forward pass")
            verb = "bounds" if len(top1) == 1 else "bound"
            return (f"{', '.join(top1)} {verb} the generation gate of fp16/bf16 and "
                    f"quantized text-generation builds, not {build}; leave it out")
        fields = type(self).model_fields
        sqnr = [flag for flag, name in (("--min-sqnr", "quant_min_sqnr_db"),
                                        ("--min-cosine", "quant_min_cosine"))
                if getattr(self, name) != fields[name].default]
        if sqnr and (generating or not self.quantize):
            build = ("a text-generation build (its gate: --min-top1, --max-kl)" if generating
                     else "a float build")
            verb = "bounds" if len(sqnr) == 1 else "bound"
            return (f"{', '.join(sqnr)} {verb} the output gate of quantized forward passes, "
                    f"not {build}; leave it out")
        return None

    @model_validator(mode="after")
    def _deterministic_excludes_tuning(self) -> "BuildSettings":
        tuned = self.options().measured_choices() if self.target in described() else []
        if self.deterministic and tuned:
            raise ValueError(f"--deterministic cannot be combined with {', '.join(tuned)}, "
                             "which keep what measured fastest on this machine")
        return self

    def options(self) -> TargetOptions:
        """The target's typed options."""
        return _parse_options(self.target, tuple(sorted(self.target_options.items(),
                                                        key=lambda kv: kv[0])))

    @field_validator("platform")
    @classmethod
    def _a_known_platform(cls, value: str) -> str:
        problem = None if value == host_platform() else unknown_platform(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("prefill_chunk")
    @classmethod
    def _a_chunk_of_two_or_more(cls, value: int | None) -> int | None:
        if value is not None and value < 2:
            raise ValueError(f"{value} is under 2: one token is a decode step, so a prefill "
                             "chunk takes 2 or more (prompts longer than it go in chunks)")
        return value

    @field_validator("memory_budget", "max_model_size", mode="before")
    @classmethod
    def _parse_size(cls, value: object) -> object:
        return parse_size(value) if isinstance(value, str) else value

    def output_path(self, model_name: str) -> Path:
        if self.out is not None:
            return self.out
        return Path(f"{model_name}-{self.target}{ARTIFACT_SUFFIX}")


def settings_from(values: dict[str, Any]) -> BuildSettings:
    """BuildSettings from the Python API's keywords: an unknown name or a bad value is the
    tool's UserInputError naming the setting (with the nearest known name), not pydantic's."""
    from exporter.errors import UserInputError
    from runtime.errors import did_you_mean
    known = set(BuildSettings.model_fields) | {
        name for card in described().values() for name in card.Options.model_fields}
    unknown = [key for key in values if key not in known]
    if unknown:
        raise UserInputError(
            f"unknown setting(s): {', '.join(unknown)}",
            details=[f"{key!r} is not a setting{did_you_mean(key, known)}" for key in unknown],
            hint="the settings are BuildSettings' fields and the targets' options "
                 "(`exporter build --help` lists them as flags)")
    try:
        return BuildSettings(**values)
    except ValidationError as exc:
        problems = [(f"{'.'.join(map(str, e['loc']))}: " if e["loc"] else "")
                    + e["msg"].removeprefix("Value error, ") for e in exc.errors()]
        raise UserInputError("invalid build settings", details=problems) from None


def _option_problem(error: dict) -> str:
    """'--tune: is an option of target tvm', said with the flag's own name."""
    where = ".".join(map(str, error["loc"]))
    message = error["msg"].removeprefix("Value error, ")
    owners = [t for t in described().values() if where in t.Options.model_fields]
    if error["type"] == "extra_forbidden":
        message = (f"is an option of target {', '.join(t.name for t in owners)}" if owners
                   else "is not a build option")
    flag = (flag_name(where, owners[0].Options.model_fields[where]) if owners
            else "--" + where.replace("_", "-"))
    return f"{flag}: {message}"


def _is_default_elsewhere(key: str, value: object) -> bool:
    for target in described().values():
        field = target.Options.model_fields.get(key)
        if field is not None and not field.is_required() and field.default == value:
            return True
    return False


@functools.lru_cache(maxsize=64)
def _parse_options(target: str, items: tuple) -> TargetOptions:
    return described()[target].Options(**dict(items))


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
