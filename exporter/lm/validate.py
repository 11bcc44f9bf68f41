"""Validation of a generating build is about generation (docs/architecture.md's policy,
applied to prefill + decode): the staged artifact, loaded by the real runtime in its own
process, generates greedily from several prompts while this process runs Hugging Face
``generate`` on the same weights. Then:

(a) fp32 builds: the artifact's tokens equal ``generate``'s, token for token; a divergence
    is accepted only at a numerical tie (eager's own top-2 margin there is within eager
    float32's error to float64), and recorded as such.
(b) cache consistency: prefill of L tokens then one decode step gives the logits of a fresh
    prefill over the L+1 tokens, and both match eager within the float tolerance.
(c) fp16/bf16 and quantized builds: teacher-forced (on the artifact's own tokens) top-1
    agreement and KL divergence against eager float32, a labelled gate.
(d) on a failure: the first prompt and step that diverged, both tokens, and the largest
    logit error there.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from exporter.builder.plain import recorded_spec
from exporter.builder.preload import preload_for
from exporter.builder.prepared import Prepared
from exporter.errors import BuildError, UserInputError, ValidationFailedError
from exporter.lm.bisect import bisect_generation
from exporter.lm.gate import EagerLogits, GenerationGate, judge_case, summary_lines
from exporter.lm.seq2seq import source_vocab
from exporter.lm.source import LanguageModel, load_language_model
from exporter.lm.wrapper import cache_keyword
from exporter.model.hf_spec import HfOptions
from exporter.model.spec import ModelSpec
from exporter.settings import BuildSettings
from exporter.ship.archive_writer import stage_artifact
from exporter.validation.bisect import bisect_lines
from exporter.validation.validate import ArtifactRun, crashed, keep_failed
from runtime.format.manifest import Manifest
from runtime.generation.layout import vocabulary
from runtime.generation.section import GenerationSection
from runtime.host import scratch

log = logging.getLogger(__name__)

PROMPTS = ("The quick brown fox jumps over the lazy dog because",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
           "In 1905 Albert Einstein published four papers that changed physics: the "
           "photoelectric effect, Brownian motion, special relativity and the equivalence "
           "of mass and energy. Each of them")
NEW_TOKENS = 64
END_TOKENS = 16  # the new tokens of the case that ends at the context bound


def validate_generation(out: Path, manifest: Manifest, files: dict, lm: LanguageModel,
                        settings: BuildSettings, preload: list[str], gate: GenerationGate,
                        preps: dict | None = None) -> dict:
    """The build's check: the staged artifact beside ``out`` generates; a miss raises,
    an fp32 one with the bisect of its first divergence (``preps``: the entry points'
    prepared programs, exporter/lm/bisect.py)."""
    staging = scratch.record(out.with_name(f".{out.name}.validating-{os.getpid()}"))
    staged = stage_artifact(staging, manifest.to_dict(), files)
    try:
        record = judge_generation(staging, manifest.generation, lm, gate, settings.seed,
                                  settings.validation_timeout_s, preload)
        if not record["passed"] and gate.bisects and preps:
            found = GenerationBisect(preps, lm, settings.seed, settings.dtype)(
                staging, manifest, record)
            if found is not None:
                record["bisect"] = found
    except BaseException as exc:
        scratch.remove(staging)
        if isinstance(exc, BuildError):  # the artifact crashed the validation process
            raise crashed(exc, out, manifest, files, settings.keep_failed) from exc
        raise
    if not record["passed"]:
        scratch.remove(staging)
        details = summary_lines(record) + (bisect_lines(record["bisect"])
                                           if "bisect" in record else [])
        record = json_safe(record)  # an artifact's NaN logits make a NaN KL
        manifest.validation = record
        kept = keep_failed(out, manifest, files) if settings.keep_failed else None
        raise ValidationFailedError(
            gate.failure(), record=record, where=str(kept or out), details=details,
            hint=(f"the failed artifact was kept at {kept}" if kept else "no new artifact was "
                  "written (a file already at the output is left as it was; --keep-failed "
                  "keeps it)") + ("; the first divergence above names the prompt, the "
                                  "step and the logit error" if record.get("first_divergence")
                                  else "; the lines above name each prompt's largest logit "
                                  "and cache errors"))
    return {**record, "staged": staged}  # the pipeline's package stage finishes it


def json_safe(value):
    """``value`` with each NaN or infinite float written as a string ("nan", "inf"): the
    manifest is strict JSON, and a failed record is kept (--keep-failed) and printed
    (--json) as it is."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


@dataclass
class GenerationBisect:
    """The first divergence's step, bisected to a partition (or the first failing case's
    first step when its tokens agree but its logits do not): validation/bisect.py's
    ``Bisector`` for a generating build."""

    preps: dict[str, Prepared]
    lm: LanguageModel
    seed: int
    dtype: str

    def __call__(self, artifact: Path, manifest: Manifest, record: dict) -> dict | None:
        first = record.get("first_divergence")
        row = next((r for r in record["outputs"] if r["case"] == (first or {}).get("case")),
                   None) or next(r for r in record["outputs"] if not r["passed"])
        index = int(row["case"].removeprefix("case"))
        prompt = generation_cases(self.lm, manifest.generation, self.seed)[index][0]
        step = first["step"] if first and first["case"] == row["case"] else 0
        return bisect_generation(artifact, manifest, self.preps, prompt, row["tokens"], step,
                                 row["case"], self.dtype)


def revalidate_generation(artifact: Path, manifest: Manifest, model: str | None,
                          inputs_file: Path | None, seed: int) -> dict:
    """``exporter validate`` of a generating artifact: judged by the generation gate its
    build used, against the model it was built from (or ``model``)."""
    if inputs_file is not None:
        raise UserInputError("--inputs does not apply to a generating artifact: it is "
                             "judged on generating from its own prompts",
                             where=str(artifact), hint="leave --inputs out")
    if isinstance(model, ModelSpec):
        raise UserInputError("a generating artifact is validated against a transformers "
                             "model spec (hf:PATH or FILE.py:NAME)", where=str(artifact))
    settings = manifest.build.get("settings", {})
    with recorded_spec(manifest, artifact) if model is None else contextlib.nullcontext():
        lm = load_language_model(model or manifest.source["spec"],
                                 HfOptions.from_settings(settings))
    _check_same_vocabulary(manifest, lm, artifact)
    gate = GenerationGate.for_build(settings.get("dtype") or "fp32", settings.get("quantize"),
                                    min_top1=settings.get("min_top1"),
                                    max_kl=settings.get("max_kl"))
    return judge_generation(artifact, manifest.generation, lm, gate, seed,
                            settings.get("validation_timeout_s"),
                            preload_for(manifest, lm.origin_file))


def _check_same_vocabulary(manifest: Manifest, lm: LanguageModel, artifact: Path) -> None:
    """--model naming another vocabulary than the artifact's: its prompts would index past
    one embedding table or the other (an IndexError in eager, exit 4, before this)."""
    ours, theirs = vocabulary(manifest.signature), lm.model.get_output_embeddings().weight.shape[0]
    if ours != theirs:
        raise UserInputError(f"the artifact's vocabulary has {ours} tokens "
                             f"and the model's {theirs}: it was built from another model",
                             where=str(artifact),
                             hint="give --model the spec the artifact was built from "
                                  f"({manifest.source['spec']!r})")


def judge_generation(artifact: Path, generation: GenerationSection, lm: LanguageModel,
                     gate: GenerationGate, seed: int, timeout: float | None,
                     preload: list[str]) -> dict:
    """``artifact`` generates from the cases in its own process while this one runs
    transformers' ``generate``; the gate's record (also ``exporter validate``'s)."""
    cases = generation_cases(lm, generation, seed)
    sources = source_cases(lm, generation, len(cases), seed)
    flat = {}
    for index, (prompt, new_tokens) in enumerate(cases):
        flat[f"case{index}/prompt"] = torch.tensor(prompt, dtype=torch.int64)
        flat[f"case{index}/new_tokens"] = torch.tensor([new_tokens], dtype=torch.int64)
        if sources[index] is not None:
            flat[f"case{index}/source"] = sources[index][0]
    run = ArtifactRun(artifact, flat, command=("exporter.lm.cases",), preload=preload,
                      timeout=timeout)
    try:  # the references, while the artifact generates in its own process
        references = [hf_greedy(lm.model, prompt, new_tokens, encoder_inputs(lm, source))
                      for (prompt, new_tokens), source in zip(cases, sources)]
        results = run.results()
    finally:
        run.close()
    eager = EagerLogits(lm.model)
    rows = [judge_case(f"case{i}", eager, prompt, references[i], results[f"case{i}"], gate,
                       encoder_inputs(lm, sources[i])) for i, (prompt, _) in enumerate(cases)]
    record = gate.record(rows, cases[0][1])
    if eager.note:
        record["warnings"].append(eager.note)
    return record


def generation_cases(lm: LanguageModel, generation: GenerationSection, seed: int
                     ) -> list[tuple[list[int], int]]:
    """(prompt, new tokens) pairs that reach every path: a one-token prompt (prefill
    through ``decode``), a short one, a long one that crosses a prefill chunk and, where
    there are sliding layers, the window (so the ring wraps during prefill and during
    decode), and one whose generation ends at the context's last position. That last one
    checks what depends on how deep a token is: Llama 4's attention temperature changed
    at position 399 of 512 while the other prompts stopped near 200 and passed."""
    context, chunk = generation.max_context, generation.prefill_chunk
    windows = [layer.window for layer in generation.cache.layers if layer.window]
    new_tokens = min(NEW_TOKENS, context // 2)
    longest = context - new_tokens
    long = min(longest, max(chunk + 7, max(windows, default=0) + 5))
    lengths = [(1, new_tokens), (min(9, longest), new_tokens), (long, new_tokens)]
    end_tokens = min(END_TOKENS, new_tokens)
    if context - end_tokens > long:
        lengths.append((context - end_tokens, end_tokens))
    # an encoder-decoder's decoder prompts start as generate's do, then go on as text
    start = generation.decoder_start
    vocab = lm.model.get_output_embeddings().weight.shape[0]
    texts = [] if start else _tokenized(lm, vocab)
    random = torch.Generator().manual_seed(seed)
    cases = []
    for index, (length, count) in enumerate(lengths):
        ids = list(start) + (texts[index % len(texts)] if texts else [])
        while len(ids) < length:  # text where there is a tokenizer, then random ids
            ids = ids + torch.randint(0, vocab, (length - len(ids),), generator=random).tolist()
        cases.append((ids[:length], count))
    return cases


def source_cases(lm: LanguageModel, generation: GenerationSection, count: int, seed: int
                 ) -> list[torch.Tensor | None]:
    """An encoder-decoder's sources, one a case (None each for a decoder-only model): text
    sources as long as the encoder takes, short, and as short as it takes (the cross
    cache's unused rows masked), from the prompts' text where there is a tokenizer; speech
    features of the model's fixed shape, random."""
    source = generation.source
    if source is None:
        return [None] * count
    random = torch.Generator().manual_seed(seed + 1)
    if source["input"] == "input_features":
        return [torch.randn(1, *source["shape"], generator=random) for _ in range(count)]
    bound, vocab = source["bound"], source_vocab(lm.model)
    texts = _tokenized(lm, vocab)
    # artifacts built before "shortest" was recorded: half the bound
    lengths = [bound, min(5, bound), source.get("shortest", max(1, bound // 2))]
    sources = []
    for index in range(count):
        length = lengths[index % len(lengths)]
        ids = texts[index % len(texts)][:length] if texts else []
        ids = ids + torch.randint(0, vocab, (length - len(ids),), generator=random).tolist()
        sources.append(torch.tensor([ids], dtype=torch.long))
    return sources


def encoder_inputs(lm: LanguageModel, source: torch.Tensor | None) -> dict:
    """The keyword arguments that give the Hugging Face model a case's source."""
    if source is None:
        return {}
    return {lm.model.main_input_name: source.to(next(lm.model.parameters()).device)}


def _tokenized(lm: LanguageModel, vocab: int) -> list[list[int]]:
    """PROMPTS as the artifact's tokenizer makes them, without ids past ``vocab`` (a
    tokenizer may have more tokens than the model: exporter/lm/source.py notes it)."""
    if lm.tokenizer is None:
        return []
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(str(lm.tokenizer))
    return [[t for t in tokenizer.encode(text).ids if t < vocab] for text in PROMPTS]


def hf_greedy(model: torch.nn.Module, prompt: list[int], new_tokens: int,
              encoder: dict | None = None) -> list[int]:
    """Hugging Face ``generate``, greedy, exactly ``new_tokens`` (eos does not stop it and
    is not masked: the artifact's raw greedy choice is what is compared)."""
    from transformers import GenerationConfig
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                              pad_token_id=0, bos_token_id=None)
    device = next(model.parameters()).device
    ids = torch.tensor([prompt], device=device)
    # generate fills every setting left None from the model's own generation config: BART's
    # forced_eos_token_id, a checkpoint's repetition_penalty or suppress_tokens would change
    # the tokens. The artifact's raw greedy choice is compared, so the model's is set aside.
    own, model.generation_config = model.generation_config, GenerationConfig()
    try:
        out = hf_generate(model, ids, config, encoder)
    finally:
        model.generation_config = own
    return out[0, len(prompt):].tolist()


def hf_generate(model: torch.nn.Module, ids: torch.Tensor, config, encoder: dict | None,
                **options) -> torch.Tensor:
    """Hugging Face ``generate`` from ``ids`` [1, L]. An encoder-decoder gets its source in
    ``encoder`` and ``ids`` as its decoder's prompt; Whisper's own ``generate`` (language
    detection, timestamps, token suppression) is passed over for the plain one that every
    model shares. The validation's reference and ``exporter bench``'s baselines."""
    from transformers import GenerationMixin
    with torch.no_grad():
        if encoder:
            config = copy.deepcopy(config)  # the caller's serves run after run
            config.decoder_start_token_id = int(ids[0, 0])
            keyword = cache_keyword(model)
            if keyword not in options:
                options[keyword] = _decoder_cache(model, config, ids.shape[1])
            return GenerationMixin.generate(model, **encoder, decoder_input_ids=ids,
                                            generation_config=config, **options)
        return model.generate(ids, generation_config=config,
                              attention_mask=torch.ones_like(ids), **options)


def _decoder_cache(model: torch.nn.Module, config, prompt_length: int):
    """An encoder-decoder's cache for ``generate``, as deep as its decoder: transformers
    sizes its own by the config's layer count, which T5's ``num_decoder_layers`` can pass
    (IndexError). One that grows by the layers that write to it, or, for
    ``cache_implementation="static"``, a static self-attention cache of the decoder's
    depth (the cross-attention cache is dynamic either way, as transformers makes it)."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache, StaticCache
    if config.cache_implementation != "static":
        return EncoderDecoderCache(DynamicCache(), DynamicCache())
    decoder = copy.deepcopy(model.config.get_text_config(decoder=True))
    depth = getattr(model.config, "num_decoder_layers", None)
    if depth:
        decoder.num_hidden_layers = depth
    config.cache_implementation = None  # given here (transformers would make its own)
    return EncoderDecoderCache(
        StaticCache(config=decoder, max_cache_len=prompt_length + config.max_new_tokens),
        DynamicCache())
