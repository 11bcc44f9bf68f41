"""``--task text-generation``: one artifact, two entry points over one KV cache.

    load model -> probe the cache layout -> for prefill and decode: capture, passes,
    partition -> lower both -> one manifest (prefill main, decode an entry point,
    the generation section) -> validate generation (subprocess) -> package

``prefill`` takes 2..prefill_chunk tokens, ``decode`` exactly one; both read the cache as
inputs and return the new rows (exporter/lm/wrapper.py, runtime/generation/layout.py).
A target whose generation facet says ``decode_on_prefill`` (onnx), or whose entry points
could not share their weights (``_one_program``), gets one program for both: prefill takes
1..prefill_chunk tokens and there is no decode entry point, unless the capture could not
keep a length of one (then decode is captured as usual). What is captured for each entry
point: exporter/lm/entries.py.
The stages are the shared ones (exporter/builder/stages.py), run once per entry point, as
``GeneratingBuild``'s part of the one pipeline (exporter/builder/pipeline.py).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from pathlib import Path
from typing import Callable

import torch

from exporter.builder.lowering import lower_options, lower_with_fallback
from exporter.builder.pipeline import dry_run
from exporter.builder.preload import preload_for
from exporter.builder.prepared import Prepared
from exporter.builder.stages import available_target, check_output_path, prepare_captured
from exporter.errors import ExportFailedError, SpecError, UserInputError
from exporter.kinds import GENERATING, BuildKind, DryRunReport
from exporter.lm.assemble import PreparedGeneration, assemble
from exporter.lm.entries import entry_specs, one_token, seq2seq_entry_specs
from exporter.lm.gate import GenerationGate
from exporter.lm.rope import check_rope, longrope_switch, static_rope
from exporter.lm.seq2seq import Source, probe_seq2seq_layout, source_of
from exporter.lm.source import LanguageModel, load_language_model
from exporter.lm.wrapper import ExportableCausalLM, probe_layout
from exporter.model.cast import DTYPES
from exporter.model.given_module import converted_copy
from exporter.model.source_lines import find_user_frame
from exporter.model.hf_spec import HfOptions
from exporter.model.spec import ModelSpec
from exporter.progress import StageHook, quiet_stage
from exporter.settings import BuildSettings
from runtime.format.manifest import Manifest
from runtime.generation.layout import CacheLayout, takes_one_token

log = logging.getLogger(__name__)


class GeneratingBuild(BuildKind):
    """prefill and decode (and an encoder-decoder's encode) over one KV cache."""

    name = GENERATING
    weight_only_keeps_dtype = True
    makes_own_inputs = True  # the model's own prompts and cache states
    validate_stage = "validate generation (subprocess)"

    def prepare(self, spec: str | torch.nn.Module, settings: BuildSettings,
                timed: Callable) -> PreparedGeneration:
        return prepare_generating(spec, settings, timed, self)

    def output(self, prepared: PreparedGeneration) -> Path:
        return prepared.preps["prefill"].out

    def lower(self, prepared: PreparedGeneration, settings: BuildSettings, work_dir: Path,
              timed: Callable) -> dict:
        preps = prepared.preps
        target = preps["prefill"].target
        lowered = {}
        for name, prep in preps.items():
            (work_dir / name).mkdir()
            with timed(f"lower {name} ({target.backend})"):
                lowered[name] = lower_with_fallback(prep, settings, work_dir / name)
        for name, pairs in lowered.items():  # one folder per partition in the artifact
            for plan, _ in pairs if name != "prefill" else ():
                plan.name = f"{name}_{plan.name}"
        return lowered

    def manifest(self, prepared: PreparedGeneration, lowered: dict, settings: BuildSettings,
                 work_dir: Path) -> tuple[Manifest, dict[str, Path], dict]:
        manifest, files = assemble(prepared, lowered, settings, work_dir)
        return manifest, files, {}

    def gate(self, settings: BuildSettings) -> GenerationGate:
        return GenerationGate.for_build(settings.dtype, settings.quantize,
                                        min_top1=settings.min_top1, max_kl=settings.max_kl)

    def validate(self, prepared: PreparedGeneration, manifest: Manifest,
                 files: dict[str, Path], settings: BuildSettings) -> dict:
        from exporter.lm.validate import validate_generation
        lm = prepared.lm
        return validate_generation(self.output(prepared), manifest, files, lm, settings,
                                   preload_for(manifest, lm.origin_file), self.gate(settings),
                                   prepared.preps)

    def dry_run_report(self, prepared: PreparedGeneration) -> DryRunReport:
        """Both entry points' placement (prefill first), as the plain dry run shows one."""
        preps, first = prepared.preps, prepared.preps["prefill"]
        return DryRunReport(
            as_json={"target": first.target.name, "placement": first.placement.summary(),
                     "signature": first.captured.signature.to_json(),
                     "coverage": first.placement.coverage, "warnings": first.warnings,
                     "entry_points": {name: {"placement": p.placement.summary(),
                                             "signature": p.captured.signature.to_json(),
                                             "coverage": p.placement.coverage}
                                      for name, p in preps.items() if name != "prefill"}},
            placements=[(f"entry point {name}", p.placement.coverage, p.placement.summary())
                        for name, p in preps.items()],
            warnings=list(dict.fromkeys(w for p in preps.values() for w in p.warnings)))

    def revalidate(self, artifact: Path, manifest: Manifest, model, inputs_file: Path | None,
                   dtype: str, seed: int) -> dict:
        from exporter.lm.validate import revalidate_generation
        return revalidate_generation(artifact, manifest, model, inputs_file, seed)


def prepare_generating(spec: str | torch.nn.Module, settings: BuildSettings,
                       timed: Callable, kind: BuildKind) -> PreparedGeneration:
    _refuse_plain_options(settings)
    target = available_target(settings, kind)
    with timed("load model"):
        lm = load_language_model(spec, HfOptions.from_settings(settings))
    out = check_output_path(settings.output_path(lm.name), lm.source, settings.force,
                            settings.inputs)
    context, chunk = lm.context_bounds(settings.max_context, settings.prefill_chunk)
    switch = longrope_switch(lm.model)
    if settings.max_context is None and switch and context > switch:  # the default: fit
        lm.notes.append(f"the KV cache holds {switch} tokens, not {context}: past the "
                        f"model's original context of {switch} positions its longrope "
                        "switches to its long factors, which a static cache cannot follow "
                        "(a larger --max-context is refused)")
        context, chunk = lm.context_bounds(switch, settings.prefill_chunk)
    check_rope(lm.model, context, lm.source)
    model = lm.model if settings.dtype == "fp32" else converted_copy(
        lm.model, dtype=DTYPES[settings.dtype])
    dtype = next(model.parameters()).dtype
    layout, source, entries_for = _entry_points(lm, model, target, settings, context, chunk,
                                                dtype)
    reference = ModelSpec(lm.source, lm.model, (), {}, None, lm.origin_file, lm.notes)
    capture = functools.partial(_capture_entry_points, target, reference, out, settings, timed)
    one_program = _one_program(target, settings, out)
    with static_rope(model):
        try:
            preps = capture(entries_for(one_program))
        except _DecodeNotCaptured as failed:
            if one_program:  # that was the fallback already
                raise failed.error from None
            preps = _decoding_on_prefill(failed, lambda: capture(entries_for(True)))
    return PreparedGeneration(lm, layout, context, chunk, preps, source)


def _one_program(target, settings: BuildSettings, out: Path) -> bool:
    """Whether prefill is the decode step too: where the target says so (onnx), and where
    the entry points could not share their weights (the cpu target's PT2E int8 recipes
    pack them into each library: a decode program of its own was a second int8 copy)."""
    generation = target.generation
    return generation.decode_on_prefill or not generation.shares_weights(
        lower_options(settings, out))


def _entry_points(lm: LanguageModel, model: torch.nn.Module, target, settings: BuildSettings,
                  context: int, chunk: int, dtype: torch.dtype
                  ) -> tuple[CacheLayout, Source | None, Callable[[bool], dict[str, ModelSpec]]]:
    """The cache layout, an encoder-decoder's source, and what to capture for each entry
    point, given whether one program (prefill from one token) serves decode too."""
    if lm.encoder_decoder:
        source = _source_of(lm, model, settings.max_source)
        layout = _probed(lm, lambda: probe_seq2seq_layout(model, source, context, dtype))
        return layout, source, lambda one_program: seq2seq_entry_specs(
            lm, model, layout, source, chunk, target.generation.step_attention, one_program)
    if settings.max_source is not None:
        raise UserInputError("--max-source applies to encoder-decoders (Whisper, BART, "
                             "T5, ...)", where=lm.source, hint="leave it out")
    try:
        layout = probe_layout(model, context, dtype)
    except NotImplementedError as exc:  # layers of no KV cache (linear attention, chunked)
        raise SpecError(f"{type(model).__name__}: {exc}", where=lm.source,
                        hint="--task text-generation builds decoders of full and "
                             "sliding-window attention layers; build its plain forward "
                             "pass (--task causal-lm) instead") from None
    except Exception as exc:  # noqa: BLE001 - the model's own forward raised
        raise _probe_failed(lm, model, exc) from exc
    wrapper = ExportableCausalLM(model, layout, target.generation.step_attention).eval()
    return layout, None, lambda one_program: entry_specs(
        lm, wrapper, layout, chunk, one_program, target.generation.next_token)


def _probe_failed(lm: LanguageModel, model: torch.nn.Module, exc: Exception) -> Exception:
    """The model raised when run on two tokens with the step's cache. If it raises without
    a cache too, it does not run in eager PyTorch at all (its config: AFMoE without a
    sliding_window): the user's to fix, exit 2. Otherwise the step's cache is what it
    cannot take: this exporter's limit, exit 3. Either way: the stage, the error and its
    line, not "an internal error"."""
    where = find_user_frame(exc)
    said = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    try:
        with torch.no_grad():
            model(input_ids=torch.zeros(1, 2, dtype=torch.long,
                                        device=next(model.parameters()).device))
    except Exception:  # noqa: BLE001 - the same failure without our cache
        return SpecError(f"{type(model).__name__} fails in eager PyTorch on two tokens "
                         f"({said})", where=str(where) if where else lm.source,
                         hint="fix the model or its config so that model(input_ids) runs; "
                              "the build starts from a model that runs eagerly")
    return ExportFailedError(
        f"{type(model).__name__} runs eagerly but not with the generating step's KV cache "
        f"({said})", where=str(where) if where else lm.source,
        hint="stage: probe the cache layout (exporter/lm/wrapper.py); build its plain "
             "forward pass (--task causal-lm) instead, and please report the model")


def _capture_entry_points(target, reference: ModelSpec, out: Path, settings: BuildSettings,
                          timed: Callable, entries: dict[str, ModelSpec]
                          ) -> dict[str, Prepared]:
    """Capture, passes and placement of each entry point; a decode step that torch.export
    cannot capture raises ``_DecodeNotCaptured``."""
    def prepared(name: str, entry: ModelSpec, from_one: bool) -> Prepared:
        try:
            with _length_from_one(from_one):
                return prepare_captured(target, reference, entry, out, settings, timed,
                                        f" {name}", shared_weights=True)
        except ExportFailedError as exc:
            if name == "decode":
                raise _DecodeNotCaptured(exc) from exc
            if name == "encode" and from_one:  # the encoder then takes 2 tokens or more
                log.info("encode from one source token not captured (%s); capturing it "
                         "as torch.export assumes, 2 or more", str(exc).splitlines()[0])
                return prepared(name, entry, False)
            raise

    def from_one(name: str, entry: ModelSpec) -> bool:
        """prefill serving decode too, and a text encoder (a one-token source)"""
        if name == "encode":
            return bool(entry.dynamic_shapes and entry.dynamic_shapes[0])
        return name == "prefill" and "decode" not in entries

    preps = {name: prepared(name, entry, from_one(name, entry))
             for name, entry in entries.items()}
    if "decode" not in entries and not takes_one_token(preps["prefill"].captured.signature):
        # torch.export specialized the length away from 1: decode gets its own program
        preps["decode"] = prepared("decode", one_token(entries["prefill"]), False)
    return preps


class _DecodeNotCaptured(Exception):
    def __init__(self, error: ExportFailedError) -> None:
        super().__init__(str(error))
        self.error = error


def _decoding_on_prefill(failed: _DecodeNotCaptured,
                         capture: Callable[[], dict[str, Prepared]]) -> dict[str, Prepared]:
    """A one-token decode step that torch.export cannot capture decodes on the prefill
    program instead, captured from one token, as onnx's always is. MVP numbers its
    positions ``arange(t, t + T)`` from two reads of the cache length: at a fixed T = 1 the
    size is a difference of two unknowns; with T dynamic it is T. The build says so."""
    try:
        preps = capture()
    except _DecodeNotCaptured:
        raise failed.error from None
    reason = str(failed.error).splitlines()[0]
    preps["prefill"].warnings.append(
        f"the one-token decode step could not be captured ({reason}); decode runs on the "
        "prefill program, which takes one token too (slower per token than a fixed-shape "
        "step)")
    return preps


def _length_from_one(wanted: bool) -> contextlib.AbstractContextManager:
    """torch.export keeps a dynamic dim's lower bound of 1 only with size-oblivious
    reasoning: otherwise it assumes 2 or more (its 0/1 specialization) and the prefill
    program would refuse one token. Size-oblivious, a check such as ``T == 1`` takes the
    general branch, which the validation's decode steps then run at T = 1."""
    if not wanted:
        return contextlib.nullcontext()
    from torch.fx.experimental import _config
    return _config.patch(backed_size_oblivious=True)


def _probed(lm: LanguageModel, probe: Callable[[], CacheLayout]) -> CacheLayout:
    """An encoder-decoder whose forward does not take given encoder states and a cross
    cache as transformers' shared ones do (Switch Transformers wants its router logits
    among the encoder outputs) is the model's limit, said with its source line."""
    try:
        return probe()
    except (AttributeError, TypeError, ValueError, IndexError, NotImplementedError) as exc:
        where = find_user_frame(exc)
        raise SpecError(f"{type(lm.model).__name__} does not decode from precomputed encoder "
                        f"states and a cross-attention cache ({type(exc).__name__}: "
                        f"{str(exc)[:160]})", where=str(where) if where else lm.source,
                        hint="stage: probe the cache layout; encoder-decoders whose decoder "
                             "takes encoder_outputs and an EncoderDecoderCache (Whisper, "
                             "BART, Marian, T5, ...) build") from exc


def _source_of(lm: LanguageModel, model: torch.nn.Module, max_source: int | None) -> Source:
    try:
        return source_of(model, max_source, lm.folder)
    except ValueError as exc:
        raise UserInputError(str(exc), where=lm.source,
                             hint="check --max-source (or leave it out)" + (
                                 "" if "max-source" in str(exc) else " and the checkpoint's "
                                 "preprocessor_config.json")) from None
    except NotImplementedError as exc:
        raise SpecError(f"{type(model).__name__}: {exc}", where=lm.source,
                        hint="encoder-decoders with a text encoder or Whisper's speech "
                             "encoder build") from None


def dry_run_generating(spec: str | torch.nn.Module, settings: BuildSettings, *,
                       stage: StageHook = quiet_stage) -> PreparedGeneration:
    """Capture both entry points, run the passes and plan the partitions; compile nothing."""
    return dry_run(spec, settings, stage=stage, kind=GeneratingBuild())


def _refuse_plain_options(settings: BuildSettings) -> None:
    """Options of a plain forward build that mean nothing for a generating one."""
    given = [flag for flag, value in (("--dynamic", settings.dynamic),
                                      ("--inputs", settings.inputs),
                                      ("--seq-len", settings.seq_len),
                                      ("--image-size", settings.image_size),
                                      ("--batch-size", settings.batch_size)) if value]
    if given:
        raise UserInputError(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not "
                             "apply to --task text-generation",
                             hint="the prompt length is dynamic up to --prefill-chunk and the "
                                  "cache holds --max-context tokens; validation generates "
                                  "from its own prompts")
    if settings.quantize == "int8-static":
        # Its activation ranges come from running the program on calibration inputs: a
        # step's inputs are cache states and positions, which random or user-given sets
        # cannot stand for (ONNX Runtime's attention op refused random positions).
        raise UserInputError("--quantize int8-static does not apply to --task "
                             "text-generation: it calibrates on one forward pass's inputs, "
                             "and a generating step's are cache states",
                             hint="use int8-dynamic (activations quantized per call), "
                                  "int8-weight or int4-weight")
