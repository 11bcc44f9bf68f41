"""The language model a text-generation build starts from, and what generation needs
beside its weights: the tokenizer file, the special token ids, the generation config.

    hf:PATH        a checkpoint folder (config.json, model.safetensors, tokenizer.json,
                   generation_config.json); the model class is AutoModelForCausalLM, or
                   for an encoder-decoder AutoModelForSeq2SeqLM / AutoModelForSpeechSeq2Seq
    FILE.py:NAME   a factory returning such a transformers model (alone, or first in a
                   tuple); its tokenizer from the folder it was loaded from, if any
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from exporter.errors import SpecError
from exporter.model.hf_spec import HfOptions, load_pretrained
from exporter.model.spec import ModelSpec, load_spec
from exporter.model.spec_names import default_stem
from runtime.generation.config_notes import unapplied

TOKENIZER_FILE = "tokenizer.json"
MAX_CONTEXT_DEFAULT = 2048
PREFILL_CHUNK_DEFAULT = 256


@dataclass
class LanguageModel:
    source: str  # the spec as given
    model: torch.nn.Module  # a transformers causal LM, float32, eval
    origin_file: str | None
    tokenizer: Path | None  # tokenizer.json, when there is one
    token_ids: dict  # bos/eos/pad ids
    generation_config: dict  # as generation_config.json holds it (for the manifest)
    notes: list[str] = field(default_factory=list)
    folder: Path | None = None  # the checkpoint folder, when there is one

    @property
    def encoder_decoder(self) -> bool:
        """Whisper, BART, Marian, ...: an ``encode`` entry point and a cross cache."""
        return bool(getattr(self.model.config, "is_encoder_decoder", False))

    @property
    def name(self) -> str:
        """The default artifact's stem, from the spec's folder, or its file and factory."""
        return default_stem(self.source)

    def context_bounds(self, max_context: int | None, prefill_chunk: int | None
                       ) -> tuple[int, int]:
        """(max_context, prefill_chunk), from the settings or the model's own limits."""
        config = self.model.config  # a decoder's positions (Whisper: max_target_positions)
        positions = (getattr(config, "max_target_positions", None)
                     or getattr(config, "max_position_embeddings", None))
        context = max_context or min(positions or MAX_CONTEXT_DEFAULT, MAX_CONTEXT_DEFAULT)
        if positions and context > positions:
            raise SpecError(f"--max-context {context} is over the model's {positions} "
                            "positions", where=self.source,
                            hint=f"give --max-context {positions} or less")
        if prefill_chunk and prefill_chunk > context:  # said, not cut down in silence
            raise SpecError(f"--prefill-chunk {prefill_chunk} is over the context of "
                            f"{context} tokens", where=self.source,
                            hint=f"give --prefill-chunk {context} or less, or a larger "
                                 "--max-context")
        chunk = min(prefill_chunk or PREFILL_CHUNK_DEFAULT, context)
        if chunk < 2:
            raise SpecError("--prefill-chunk must leave room for 2 tokens", where=self.source,
                            hint="give --prefill-chunk 2 or more")
        return context, chunk


def load_language_model(spec: str | torch.nn.Module, options: HfOptions) -> LanguageModel:
    if isinstance(spec, torch.nn.Module):
        return _described(f"python:{type(spec).__qualname__}", spec, None, [])
    text = spec.strip()
    if text.startswith("hf:"):
        model, _, task, notes = load_pretrained(text, text[3:], options)
        if task != "text-generation":
            raise SpecError(f"--task {task} does not generate text", where=text,
                            hint="build with --task text-generation")
        return _described(text, model, Path(text[3:]).expanduser(), notes)
    loaded: ModelSpec = load_spec(text, module_only=True)
    return _described(text, loaded.module, None, loaded.notes, loaded.origin_file)


def _described(source: str, model: torch.nn.Module, folder: Path | None, notes: list[str],
               origin: str | None = None) -> LanguageModel:
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "generation_config") or not getattr(
            type(model), "can_generate", lambda: False)():
        raise SpecError(f"{type(model).__name__} is not a transformers model that generates",
                        where=source, hint="--task text-generation takes a model built by "
                        "AutoModelForCausalLM or AutoModelForSeq2SeqLM / "
                        "AutoModelForSpeechSeq2Seq (or a factory returning one)")
    model = model.float().eval()
    if not getattr(config, "is_encoder_decoder", False):
        _refuse_alibi(config, source)
        _refuse_bidirectional(model, source)
    if folder is None and getattr(model, "name_or_path", None):
        candidate = Path(model.name_or_path)
        folder = candidate if candidate.is_dir() else None
    tokenizer = folder / TOKENIZER_FILE if folder and (folder / TOKENIZER_FILE).is_file() else None
    vocab = getattr(config, "vocab_size", None) or model.get_output_embeddings().weight.shape[0]
    if tokenizer is not None:
        notes = notes + _check_tokenizer(tokenizer, vocab)
    else:
        notes = notes + ["no tokenizer.json beside the model: the artifact takes token ids, "
                         "not text"]
    generation = model.generation_config.to_dict()
    notes = notes + _config_notes(generation)
    if generation.get("lang_to_id"):  # Whisper: full names too, as its generate takes them
        generation["language_codes"] = _language_codes(generation["lang_to_id"])
    keys = ("bos", "eos", "pad") + (("decoder_start",) if getattr(
        config, "is_encoder_decoder", False) else ())
    ids = {key: _ids(generation.get(f"{key}_token_id", getattr(config, f"{key}_token_id", None)))
           for key in keys}
    outside = {k: v for k, v in ids.items() if any(not 0 <= t < vocab for t in v)}
    if outside:  # a random-weight config copied from elsewhere often keeps 32000/50256
        notes = notes + [f"{k}_token_id {v} is outside the vocabulary of {vocab}: ignored"
                         for k, v in outside.items()]
        ids = {k: ([] if k in outside else v) for k, v in ids.items()}
    return LanguageModel(source, model, origin, tokenizer, ids,
                         json.loads(json.dumps(generation, default=str)), notes, folder)


def _config_notes(generation: dict) -> list[str]:
    """Said at build as well as when generating: what the checkpoint's generation config
    asks of transformers' generate that the artifact's generator does not do."""
    notes = []
    ignored = unapplied(generation)
    if ignored:
        notes.append(f"the checkpoint's generation config sets {', '.join(ignored)}, which "
                     "the artifact's generator does not apply: its tokens are not those of "
                     "model.generate(ids) with the checkpoint's defaults")
    if generation.get("do_sample"):
        notes.append("the checkpoint's generation config samples (do_sample); the artifact "
                     "generates greedily unless asked (--temperature, --top-k, --top-p)")
    return notes


def _language_codes(lang_to_id: dict) -> dict[str, str]:
    """{"french": "fr", ...} for the languages the checkpoint has tokens for: transformers'
    Whisper ``generate`` takes a language's name or its code, and the runtime, which has no
    transformers, reads this table from the manifest (runtime/generation/prompting.py)."""
    from transformers.models.whisper.tokenization_whisper import TO_LANGUAGE_CODE
    return {name: code for name, code in TO_LANGUAGE_CODE.items()
            if f"<|{code}|>" in lang_to_id}


def _refuse_alibi(config, source: str) -> None:
    """ALiBi models (BLOOM; MPT and Falcon where their config says ``alibi``) build their
    position biases from a [batch, length] attention mask over the whole sequence, and the
    cache's steps hand the model a 4D mask over their slots: torch.export then failed in
    ``build_alibi_tensor`` with a message about the mask's shape."""
    attention = getattr(config, "attn_config", None)
    in_attention = (attention.get("alibi") if isinstance(attention, dict)
                    else getattr(attention, "alibi", False))
    if getattr(config, "model_type", None) == "bloom" or getattr(config, "alibi", False) \
            or in_attention:
        raise SpecError(f"{getattr(config, 'model_type', 'this model')} uses ALiBi position "
                        "biases, which --task text-generation does not support yet (they are "
                        "built from a 2D mask over the whole sequence, not over a static "
                        "cache's slots)", where=source,
                        hint="build its plain forward pass (--task causal-lm), or a rotary "
                             "or learned-position model for generation")


def _refuse_bidirectional(model: torch.nn.Module, source: str) -> None:
    """A decoder's logits at a position do not change when a token is appended: generating
    from a cache rests on it. An encoder loaded as a causal LM (BERT as BertLMHeadModel)
    attends both ways; its build ran to the validation's cache check (exit 1). Two eager
    forwards of a few tokens say so before any capture."""
    vocab = getattr(model.config, "vocab_size", None) or 2
    ids = torch.arange(1, 6)[None] % vocab
    try:
        with torch.no_grad():
            longer = model(input_ids=ids, use_cache=False).logits[0, :4].float()
            shorter = model(input_ids=ids[:, :4], use_cache=False).logits[0].float()
    except Exception:  # noqa: BLE001 - a model this probe cannot call: the build will say why
        return
    # Decoders (28 tiny families, MoE and ALiBi ones too) moved by <= 6e-7 of their
    # largest logit, float32 rounding; a BERT with its own init's small weights by 2.4e-3
    change = float((longer - shorter).abs().max())
    if change > 1e-4 * max(1.0, float(shorter.abs().max())):
        raise SpecError(f"{type(model).__name__} is not a causal decoder: its logits at earlier "
                        f"positions change when a token is appended (by up to {change:.3g}), so "
                        "it cannot generate from a cache", where=source,
                        hint="--task text-generation takes decoders (LLaMA, GPT-2, ...) and "
                             "encoder-decoders (T5, Whisper, ...); an encoder-only model "
                             "(BERT, RoBERTa, ...) builds its forward pass with --task "
                             "feature-extraction or text-classification")


def _check_tokenizer(path: Path, vocab: int) -> list[str]:
    """The tokenizer file loads, before a build that would find out at its validation;
    a note where it has ids past the model's vocabulary (text that reaches them is refused
    at run time; the validation's prompts leave them out)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return []  # generation then takes token ids; the runtime says so
    try:
        size = Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True)
    except Exception as exc:  # noqa: BLE001 - the Rust side raises one Exception type
        raise SpecError(f"{path.name} cannot be read by the tokenizers package "
                        f"({str(exc).splitlines()[0][:200]})", where=str(path),
                        hint="write it again with the tokenizer's save_pretrained(), or "
                             "remove it to build an artifact that takes token ids") from None
    if size <= vocab:
        return []
    return [f"{path.name} has {size} tokens, the model's vocabulary {vocab}: text that "
            f"tokenizes to ids {vocab} or more is refused when generating"]


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
