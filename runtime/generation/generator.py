"""Text generation over a generating artifact: prefill the prompt in chunks, then decode
one token at a time, with the one KV cache the runtime owns (runtime/generation/cache.py).

    program = runtime.load("llama-cpu.artifact")
    result = program.generate("Once upon a time", max_new_tokens=64)
    result.text, result.tokens, result.stats

A prompt chunk of one token goes through ``decode`` (``prefill`` takes 2 or more).

An encoder-decoder artifact (Whisper, BART, ...) also has ``encode``: ``generate(prompt,
source=...)`` encodes the source (text, token ids, or a speech model's input features)
into the cross-attention cache first; the prompt is the decoder's, by default its start
token.
"""

from __future__ import annotations

import logging
import numbers
import time
from typing import Callable, Iterator, Sequence

import torch

from runtime.errors import ArtifactError, UserInputError
from runtime.generation.audio import Waveform, checked_features, log_mel
from runtime.generation.cache import KvCache
from runtime.generation.config_notes import (default_new_tokens, forced_tokens, sampling_note,
                                             unapplied)
from runtime.generation.layout import (INPUT_IDS, LOGITS, POSITIONS, CacheLayout,
                                       shortest_source, takes_one_token, vocabulary)
from runtime.generation.prompting import (Suppression, speech_prompt, takes_language,
                                         token_ids)
from runtime.generation.result import GenerationResult, generation_stats
from runtime.generation.sampling import Sampler, Sampling
from runtime.generation.stopping import StoppingText, checked_stops
from runtime.generation.tokenizer import Tokenizer, tokenizers_installed

log = logging.getLogger(__name__)


class Generator:
    def __init__(self, program) -> None:
        generation = program.manifest.generation
        where = program.source
        if generation is None:
            raise UserInputError("this artifact does not generate text (it was not built "
                                 "with --task text-generation)", where=where,
                                 hint="use program.run / `exporter run` for a plain forward")
        try:
            self.layout = CacheLayout.from_json(generation["cache"])
            self.max_context = int(generation["max_context"])
            self.prefill_chunk = int(generation["prefill_chunk"])
            self.eos = frozenset(int(t) for t in generation.get("eos_token_ids") or [])
            self.source = generation.get("source")  # an encoder-decoder's encoder input
            self.decoder_start = [int(t) for t in
                                  generation.get("decoder_start_token_ids") or []]
            masked = self.source is not None and self.source["input"] == "input_ids"
            self.config = dict(generation.get("generation_config") or {})
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"the generation section is malformed ({exc})", where=where,
                                hint="rebuild the artifact with `exporter build`") from exc
        self.where = where
        # no decode entry point: the prefill program takes one token too (exporter/lm/build.py)
        self.prefill = program
        self.decode = program.entry_points.get("decode") or _one_token_prefill(program, where)
        self.device = _device_of(self.decode)
        self.vocab = vocabulary(program.manifest.signature)
        # runtime/generation/prompting.py; the step's logits are on the cache's device
        self.suppress = Suppression(self.config, self.vocab, self.device)
        self.cache = KvCache(self.layout, self.device, source_mask=masked)
        self.encode = program.entry_points.get("encode")
        if (self.source is None) != (self.encode is None) or (
                self.source is not None and not self.layout.cross):
            raise ArtifactError("the artifact's encode entry point, source and cross cache "
                                "do not agree", where=where,
                                hint="rebuild the artifact with `exporter build`")
        # each entry point's inputs as a list in its own order (Program.run's fast path):
        # the two token inputs first, then the cache buffers, which never change identity
        self._buffers = {id(p): [self.cache.buffers[name] for name in p.input_names[2:]]
                         for p in (self.prefill, self.decode)}
        for p in (self.prefill, self.decode):
            if p.input_names[:2] != [INPUT_IDS, POSITIONS] or set(p.input_names[2:]) != set(
                    self.cache.buffers):
                raise ArtifactError(f"the entry points' inputs ({', '.join(p.input_names)}) "
                                    "do not match the cache layout", where=where,
                                    hint="rebuild the artifact with `exporter build`")
        self._noted = self._noted_sampling = False  # _say_config_notes: once each
        self._tokenizer_json = program.tokenizer_json
        self._tokenizer: Tokenizer | None = None
        self._noted_ids = False  # said once: ids out, the tokenizers package missing
        self._graph = None
        # a fixed-shape decode step only: one that runs on the prefill program (a model
        # whose one-token step could not be captured, exporter/lm/build.py) runs plain, and
        # so does one with a partition on the CPU fallback (an MoE's experts: host copies
        # and a host sync, which a CUDA graph cannot capture)
        if self.device.type == "cuda" and program.decode_graphs and \
                "decode" in program.entry_points and all(
                    p.device == "cuda" for p in self.decode.manifest.partitions):
            from runtime.generation.decode_graph import DecodeGraph
            self._graph = DecodeGraph(self, self.device)

    @property
    def _writes_text(self) -> bool:
        """Whether new tokens come out as text too: the artifact has a tokenizer and the
        ``tokenizers`` package is here (ids in and out need neither)."""
        return self._tokenizer_json is not None and (self._tokenizer is not None
                                                     or tokenizers_installed())

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = Tokenizer(self._tokenizer_json, where=self.where)
        return self._tokenizer

    # ------------------------------------------------------------------ the two steps

    def step(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Run ``tokens`` (1-D) at positions ``start...``; returns their logits [T, vocab]
        and stores their keys/values in the cache."""
        count = tokens.shape[0]
        if count == 1 and self._graph is not None:
            return self._graph(int(tokens[0]), start)
        positions = torch.arange(start, start + count, device=self.device)
        return self.run_step(tokens.to(self.device), positions)

    def run_step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The step on device tensors (what the decode graph captures)."""
        count = tokens.shape[0]
        program = self.decode if count == 1 else self.prefill
        out = program.run_in_place([tokens.view(1, count), positions,
                                    *self._buffers[id(program)]])
        self.cache.write(positions, out)
        return out[LOGITS][0]

    def prefill_prompt(self, prompt: Sequence[int]) -> torch.Tensor:
        """Feed the whole prompt in chunks of at most ``prefill_chunk``; its last logits."""
        ids = torch.as_tensor(list(prompt), dtype=torch.long)
        logits = None
        for start in range(0, ids.shape[0], self.prefill_chunk):
            logits = self.step(ids[start:start + self.prefill_chunk], start)
        return logits[-1]

    def forced_logits(self, prompt: Sequence[int], continuation: Sequence[int]) -> torch.Tensor:
        """Teacher forcing: the logits [len(continuation), vocab] predicting each token of
        ``continuation`` after the prompt, each decode step fed the given token."""
        self._check_length(len(prompt), len(continuation))
        self._check_tokens([*prompt, *continuation])
        rows = [self.prefill_prompt(prompt).float().cpu()]
        position = len(prompt)
        for token in continuation[:-1]:
            rows.append(self.step(torch.tensor([token]), position)[-1].float().cpu())
            position += 1
        return torch.stack(rows)

    # ------------------------------------------------------------------ encoder-decoders

    def set_source(self, source) -> int:
        """Encode ``source`` into the cross-attention cache; returns its length in rows.
        Text (the artifact's tokenizer) or token ids for a text encoder; input features
        ([mel bins, frames], optionally with a batch of 1) or a ``Waveform`` for Whisper."""
        if self.encode is None:
            raise UserInputError("this artifact has no encoder: it takes no source",
                                 where=self.where, hint="give only the prompt")
        spec = self.source
        if isinstance(source, Waveform):  # runtime/generation/audio.py
            if not spec.get("audio"):
                raise UserInputError("this artifact takes no audio", where=self.where,
                                     hint="only Whisper artifacts compute their features "
                                          "from audio; give input features or a text source")
            mels, frames = spec["shape"]
            source = torch.from_numpy(log_mel(source, spec["audio"], mels, frames))
        if spec["input"] == "input_ids":
            given = None if isinstance(source, str) else torch.as_tensor(source)
            if given is not None and given.numel() and given.is_floating_point():
                raise UserInputError("this artifact's encoder takes text or token ids, not "
                                     "input features", where=self.where,
                                     hint="give --source TEXT or --source-ids 1,2,3")
            ids = self._token_ids(source if given is None else given.reshape(-1).tolist())
            low = shortest_source(self.encode.manifest.signature)
            if not low <= len(ids) <= spec["bound"]:
                raise UserInputError(f"the source has {len(ids)} token(s); this artifact's "
                                     f"encoder takes {low} to {spec['bound']}", where=self.where,
                                     hint="shorten the source" if len(ids) > spec["bound"]
                                     else f"give a longer source (torch.export captured this "
                                          f"encoder for {low} or more)" if low > 1
                                     else "give a source")
            self._check_tokens(ids, spec.get("vocab"))
            value = torch.tensor([ids], dtype=torch.long)
        else:
            value = checked_features(source, spec["shape"], self.where).to(
                getattr(torch, self.layout.dtype))
        return self.cache.set_source(self.encode.run([value.to(self.device)]))

    def _decoder_prompt(self, prompt, language: str | None, task: str | None) -> list[int]:
        """The decoder's prompt: the one given, else its start token, which a speech model
        follows with its language and task tokens (runtime/generation/prompting.py). A
        given one starts with the decoder start token, as transformers' ``generate`` makes
        it (Whisper's excepted); text, without the tokenizer's template (bos ... eos)."""
        if prompt is not None and (isinstance(prompt, str) or len(prompt) > 0):
            if language is not None or task is not None:
                raise UserInputError("a language or task is for the default decoder prompt; "
                                     "this call gives its own", where=self.where,
                                     hint="leave out the prompt, or put those tokens in it")
            ids = (self.tokenizer.encode(prompt, special=False) if isinstance(prompt, str)
                   else token_ids(prompt, self.where))
            start = self.decoder_start[:1]
            if start and not takes_language(self.config) and ids[:1] != start:
                ids = start + ids
            return ids
        if not self.decoder_start:
            raise UserInputError("the artifact names no decoder start token",
                                 where=self.where, hint="give the decoder prompt's ids")
        if takes_language(self.config):
            return speech_prompt(self.config, self.decoder_start, language, task,
                                 self._likeliest, self.where)
        return list(self.decoder_start) + self._no_language(language, task)

    def _no_language(self, language: str | None, task: str | None) -> list[int]:
        if language is not None or task is not None:
            raise UserInputError("this model's prompt takes no language or task tokens",
                                 where=self.where, hint="leave out --language and --task")
        return []

    def _likeliest(self, prompt: list[int], candidates: list[int]) -> int:
        """Of ``candidates``, the token the model scores highest after ``prompt``
        (Whisper's language detection: the source is already encoded)."""
        scores = self.prefill_prompt(prompt).float()
        return candidates[int(scores[torch.tensor(candidates, device=scores.device)].argmax())]

    def _token_ids(self, text_or_ids: str | Sequence[int]) -> list[int]:
        """Text through the artifact's tokenizer; ids as ``token_ids`` reads them."""
        if isinstance(text_or_ids, str):
            return self.tokenizer.encode(text_or_ids)
        return token_ids(text_or_ids, self.where)

    # ------------------------------------------------------------------ generation

    def generate(self, prompt: str | Sequence[int] | None, max_new_tokens: int | None = None, *,
                 sampling: Sampling = Sampling(), stop: Sequence[str] = (),
                 stop_at_eos: bool = True,
                 stream: Callable[[int | None, str | None], None] | None = None,
                 source=None, language: str | None = None,
                 task: str | None = None) -> GenerationResult:
        """``source``: an encoder-decoder's input (``set_source``), required there; its
        ``prompt`` is the decoder's (None: the decoder start token, which Whisper follows
        with ``language`` (else detected) and ``task`` tokens, as transformers does).
        The generation config's suppressed tokens never come out; ``max_new_tokens`` None
        is its ``max_new_tokens``, else 128; what else it sets is said once
        (runtime/generation/config_notes.py)."""
        started = time.perf_counter()  # time to first token counts the encoder too
        self._say_config_notes(sampling)
        if max_new_tokens is None:
            max_new_tokens = default_new_tokens(self.config)
        encode_s = None
        if source is not None:  # set_source refuses it where there is no encoder
            self.set_source(source)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            encode_s = round(time.perf_counter() - started, 6)
        elif self.encode is not None:
            raise UserInputError("an encoder-decoder artifact needs a source to encode",
                                 where=self.where, hint="give the source (--source, "
                                 "--source-ids, --source-features or --source-audio; source= "
                                 "in Python); the prompt is the decoder's")
        prompt_ids = (self._decoder_prompt(prompt, language, task) if self.encode is not None
                      else self._token_ids(prompt) + self._no_language(language, task))
        stop = checked_stops(stop, self.where)
        if stop and self._tokenizer_json is None:
            raise UserInputError("stop strings need the artifact's tokenizer, which this "
                                 "artifact lacks", where=self.where, hint="stop on eos instead")
        self._check_length(len(prompt_ids), 0)
        self._check_tokens(prompt_ids)
        if not isinstance(max_new_tokens, numbers.Integral) or isinstance(max_new_tokens, bool) \
                or max_new_tokens < 0:
            raise UserInputError(f"max_new_tokens is {max_new_tokens!r}", where=self.where,
                                 hint="give a whole number, 0 or more")
        # the last new token is never fed back: it needs no slot of the cache
        budget = min(max_new_tokens, self.max_context - len(prompt_ids) + 1)
        sample = Sampler(sampling)
        logits = self.prefill_prompt(prompt_ids)
        tokens: list[int] = []
        first_at = None
        # the text as it grows: for stop strings and the stream; else decoded once at the end
        text = (StoppingText(self.tokenizer, stop, stream) if self._tokenizer_json is not None
                and (stop or (stream is not None and self._writes_text)) else None)
        reason = "max_new_tokens" if budget == max_new_tokens else "context_full"
        forced = forced_tokens(self.config, len(prompt_ids), max_new_tokens)
        for token in self._new_tokens(logits, len(prompt_ids), sample, forced, budget):
            first_at = first_at or time.perf_counter()
            if stop_at_eos and token in self.eos:
                reason = "eos"
                break
            tokens.append(token)
            if text is None and stream is not None:  # no tokenizer: ids only
                stream(token, None)
            if text is not None and text.add(tokens):
                reason = "stop_string"
                break
        stats = generation_stats(started, first_at, time.perf_counter(), len(prompt_ids),
                                 len(tokens), encode_s or 0.0)
        if encode_s is not None:
            stats["encode_s"] = encode_s
        decoded = (text.finish() if text is not None else self.tokenizer.decode(tokens)
                   if self._writes_text else None)
        if decoded is None and self._tokenizer_json is not None and not self._noted_ids:
            self._noted_ids = True
            log.warning("the 'tokenizers' package is not installed: the new tokens come out "
                        "as ids, not text (pip install tokenizers)")
        return GenerationResult(prompt_ids, tokens, decoded, reason, stats)

    def _new_tokens(self, logits: torch.Tensor, start: int, sample: Sampler,
                    forced: dict[int, int], budget: int) -> Iterator[int]:
        """Up to ``budget`` new tokens after the prompt's last ``logits``, each step run
        only when the caller asks for the next (it stops at eos or a stop string)."""
        for index in range(budget):
            token = forced.get(index, sample(self.suppress(logits, index == 0)
                                             if self.suppress else logits))
            yield token
            if index + 1 == budget:
                return
            if self._graph is not None and sample.sampling.greedy and not any(
                    i > index for i in forced) and self.suppress.always is None:
                # greedy on the GPU: the rest chosen in the graph, a step ahead of the host
                yield from self._graph.greedy(token, start + index, budget - index - 1)
                return
            logits = self.step(torch.tensor([token]), start + index)[-1]

    def _say_config_notes(self, sampling: Sampling) -> None:
        notes = [] if self._noted else [", ".join(unapplied(self.config))]
        notes = [f"the checkpoint's generation config sets {n}, which this generator does not "
                 "apply" for n in notes if n]
        note = sampling_note(self.config, sampling)
        if note and not self._noted_sampling:
            notes.append(note)
            self._noted_sampling = True
        self._noted = True
        for line in notes:
            log.warning(line)

    def _check_tokens(self, tokens: Sequence[int], vocab: int | None = None) -> None:
        """An id outside the vocabulary would index past the embedding table (a crash in
        compiled code, not an error): refused here. ``vocab``: a text encoder's own, where
        the manifest gives it (Marian's source vocabulary may differ from its target's)."""
        vocab = vocab or self.vocab
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise UserInputError(f"{len(bad)} token id(s) outside the vocabulary of "
                                 f"{vocab}: {', '.join(map(str, bad[:5]))}",
                                 where=self.where, hint=f"ids go from 0 to {vocab - 1}")

    def _check_length(self, prompt: int, extra: int) -> None:
        if prompt < 1:
            raise UserInputError("the prompt is empty", where=self.where,
                                 hint="give at least one token")
        if prompt + extra > self.max_context:
            given = (f"{prompt} prompt tokens" + (" (the decoder's start tokens included)"
                                                  if self.encode is not None else "")
                     + (f" and {extra} more" if extra else ""))
            raise UserInputError(f"{given} do not fit the artifact's "
                                 f"context of {self.max_context} tokens", where=self.where,
                                 hint="shorten the prompt, or rebuild with a larger "
                                      "--max-context")


def _one_token_prefill(program, where: str):
    """The prefill program as the decode step, when its length goes down to one token."""
    if not takes_one_token(program.manifest.signature):
        raise ArtifactError("the artifact has no decode entry point, and its prefill does not "
                            "take a single token", where=where,
                            hint="rebuild the artifact with `exporter build`")
    return program


def _device_of(program) -> torch.device:
    """Where the cache lives: with the partitions that read it (cuda if any does)."""
    devices = {p.device for p in program.manifest.partitions}
    return torch.device("cuda" if "cuda" in devices else "cpu")
