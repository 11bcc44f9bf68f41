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

Threads: ``generate``, ``forced_logits`` and ``set_source`` (and ``Program.generate``,
which calls this generator) hold its ``lock``: calls from many threads take turns on the
one cache, each giving exactly the tokens it gives alone (a stream callback is called
with the lock held; one that generates again on this thread is refused, not deadlocked).
``step``, ``run_step`` and ``prefill_prompt`` are the raw steps over that cache and take
no lock: a caller that runs a sequence of them while other threads generate wraps the
whole sequence in ``with generator.holding():``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Callable, Iterator, Sequence

import torch

from runtime.errors import ArtifactError, UserInputError
from runtime.generation.cache import KvCache
from runtime.generation.encoder import EncoderSide
from runtime.generation.config_notes import (default_new_tokens, forced_tokens, sampling_note,
                                             unapplied)
from runtime.generation.layout import (INPUT_IDS, LOGITS, NEXT_TOKEN, POSITIONS,
                                       takes_one_token)
from runtime.generation.options import check_options, checked_sampling
from runtime.generation.prompting import Suppression, token_ids
from runtime.generation.result import GenerationResult, generation_stats
from runtime.generation.sampling import Sampler, Sampling
from runtime.generation.stopping import StoppingText, checked_stops
from runtime.generation.tokenizer import ArtifactText, Tokenizer

log = logging.getLogger(__name__)


class Generator(EncoderSide):
    def __init__(self, program) -> None:
        where = program.source
        if program.manifest.generation is None:
            raise UserInputError("this artifact does not generate text (it was not built "
                                 "with --task text-generation)", where=where,
                                 hint="use program.run / `exporter run` for a plain forward")
        # checked against the programs before the cache is allocated (settings.py)
        settings = program.generation_settings()
        self.settings, self.layout = settings, settings.layout
        self.max_context, self.prefill_chunk = settings.max_context, settings.prefill_chunk
        self.eos, self.source = settings.eos, settings.source
        self.decoder_start, self.config = settings.decoder_start, settings.config
        self.where = where
        # no decode entry point: the prefill program takes one token too (exporter/lm/build.py)
        self.prefill = program
        self.decode = program.entry_points.get("decode") or _one_token_prefill(program, where)
        self.device, self.vocab = settings.device, settings.vocab
        # runtime/generation/prompting.py; the step's logits are on the cache's device
        self.suppress = Suppression(self.config, self.vocab, self.device)
        self.encode = program.entry_points.get("encode")
        if (self.source is None) != (self.encode is None) or (
                self.source is not None and not self.layout.cross):
            raise ArtifactError("the artifact's encode entry point, source and cross cache "
                                "do not agree", where=where,
                                hint="rebuild the artifact with `exporter build`")
        for p in (self.prefill, self.decode):
            if p.input_names[:2] != [INPUT_IDS, POSITIONS] or set(p.input_names[2:]) != set(
                    name for name, _ in self.layout.names() + self.layout.cross_names()) | (
                    {"source_mask"} if self._masked else set()):
                raise ArtifactError(f"the entry points' inputs ({', '.join(p.input_names)}) "
                                    "do not match the cache layout", where=where,
                                    hint="rebuild the artifact with `exporter build`")
        self.cache = KvCache(self.layout, self.device, source_mask=self._masked)
        # each entry point's inputs as a list in its own order (Program.run's fast path):
        # the two token inputs first, then the cache buffers, which never change identity
        self._buffers = {id(p): [self.cache.buffers[name] for name in p.input_names[2:]]
                         for p in (self.prefill, self.decode)}
        self._said: dict[str, bool] = {}  # _say_config_notes: once each
        self._text = ArtifactText(program.tokenizer_json, where)
        self.lock = threading.Lock()  # one call on this cache at a time
        self._holder: int | None = None  # the thread that holds it
        self._generating = False  # within generate, on the holding thread
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
    def _masked(self) -> bool:  # a text encoder's source rows are masked
        return self.source is not None and self.source["input"] == "input_ids"

    # ------------------------------------------------------------------ threads

    def held_here(self) -> bool:
        return self._holder == threading.get_ident()

    @contextlib.contextmanager
    def holding(self):
        """``lock``, held by this thread for the block (again inside it: a no-op). Hold
        it around a sequence of raw steps while other threads use this generator."""
        if self.held_here():
            yield self
            return
        self.lock.acquire()
        self._holder = threading.get_ident()
        try:
            yield self
        finally:
            self._holder = None
            self.lock.release()

    @property
    def _writes_text(self) -> bool:
        """Whether new tokens come out as text too: the artifact has a tokenizer that
        reads, and the ``tokenizers`` package is here (ids in and out need neither)."""
        return self._text.usable() is not None

    @property
    def tokenizer(self) -> Tokenizer:
        return self._text.get()

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
        """The step on device tensors."""
        return self.run_step_token(tokens, positions)[0]

    def run_step_token(self, tokens: torch.Tensor, positions: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``run_step``'s logits and the greedy next token where the step returns one
        (``NEXT_TOKEN``: the last row's argmax, int64 [1]), else None (what the decode
        graph captures)."""
        count = tokens.shape[0]
        program = self.decode if count == 1 else self.prefill
        out = program.run_in_place([tokens.view(1, count), positions,
                                    *self._buffers[id(program)]])
        self.cache.write(positions, out)
        return out[LOGITS][0], out.get(NEXT_TOKEN)

    def prefill_prompt(self, prompt: Sequence[int]) -> torch.Tensor:
        """Feed the whole prompt in chunks of at most ``prefill_chunk``; its last logits."""
        ids = torch.as_tensor(list(prompt), dtype=torch.long)
        logits = None
        for start in range(0, ids.shape[0], self.prefill_chunk):
            logits = self.step(ids[start:start + self.prefill_chunk], start)
        return logits[-1]

    def forced_logits(self, prompt: Sequence[int], continuation: Sequence[int]) -> torch.Tensor:
        """Teacher forcing: the logits [len(continuation), vocab] predicting each token of
        ``continuation`` after the prompt, each decode step fed the given token. Takes
        ``lock``: safe from several threads (they take turns)."""
        prompt, continuation = token_ids(prompt, self.where), token_ids(continuation,
                                                                        self.where)
        with self.holding():
            return self._forced_logits(prompt, continuation)

    def _forced_logits(self, prompt: list[int], continuation: list[int]) -> torch.Tensor:
        self._check_length(len(prompt), len(continuation))
        self._check_tokens([*prompt, *continuation])
        rows = [self.prefill_prompt(prompt).float().cpu()]
        position = len(prompt)
        for token in continuation[:-1]:
            rows.append(self.step(torch.tensor([token]), position)[-1].float().cpu())
            position += 1
        return torch.stack(rows)

    def _token_ids(self, text_or_ids: str | Sequence[int], bound: int | None = None
                   ) -> list[int]:
        """Text through the artifact's tokenizer; ids as ``token_ids`` reads them.
        ``bound``: the most tokens that can be taken (the context by default)."""
        if isinstance(text_or_ids, str):
            return self.tokenizer.encode(text_or_ids, max_tokens=bound or self.max_context)
        return token_ids(text_or_ids, self.where)

    # ------------------------------------------------------------------ generation

    def generate(self, prompt: str | Sequence[int] | None, max_new_tokens: int | None = None,
                 *, sampling: Sampling | dict | None = None, stop: Sequence[str] = (),
                 stop_at_eos: bool = True,
                 stream: Callable[[int | None, str | None], None] | None = None,
                 source=None, language: str | None = None, task: str | None = None,
                 **unknown) -> GenerationResult:
        """``source``: an encoder-decoder's input (``set_source``), required there; its
        ``prompt`` is the decoder's (None: the decoder start token, which Whisper follows
        with ``language`` (else detected) and ``task`` tokens, as transformers does).
        ``sampling``: a Sampling or a dict of its fields. The generation config's
        suppressed tokens never come out; ``max_new_tokens`` None is its
        ``max_new_tokens``, else 128; what else it sets is said once
        (runtime/generation/config_notes.py). Holds ``lock`` (module docstring)."""
        if unknown:
            raise UserInputError(f"generate takes no option {', '.join(sorted(unknown))}",
                                 where=self.where, hint="the options are max_new_tokens, "
                                 "sampling, stop, stop_at_eos, stream, source, language, task")
        with self.holding():
            if self._generating:  # this thread, inside its own generation: a stream callback
                raise UserInputError("generate was called again from inside its own "
                                     "generation (a stream callback)", where=self.where,
                                     hint="collect the tokens in the callback and generate "
                                          "after the call returns")
            self._generating = True
            try:
                return self._generate(prompt, max_new_tokens, sampling=sampling, stop=stop,
                                      stop_at_eos=stop_at_eos, stream=stream, source=source,
                                      language=language, task=task)
            finally:
                self._generating = False

    def _generate(self, prompt, max_new_tokens, *, sampling, stop, stop_at_eos, stream,
                  source, language, task) -> GenerationResult:
        started = time.perf_counter()  # time to first token counts the encoder too
        sampling = checked_sampling(sampling, self.where)
        check_options(self.where, max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos,
                      stream=stream, language=language, task=task)
        stop = checked_stops(stop, self.where)
        self._say_config_notes(sampling)
        if max_new_tokens is None:
            max_new_tokens = default_new_tokens(self.config)
        encode_s = None
        if source is not None:  # set_source refuses it where there is no encoder
            self._set_source(source)
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
        if stop and self._text.json_text is None:
            raise UserInputError("stop strings need the artifact's tokenizer, which this "
                                 "artifact lacks", where=self.where, hint="stop on eos instead")
        self._check_length(len(prompt_ids), 0)
        self._check_tokens(prompt_ids)
        # the text as it grows: for stop strings and the stream; else decoded once at the end
        text = (StoppingText(self.tokenizer, stop, stream) if stop or (
            stream is not None and self._writes_text) else None)
        tokens, reason, first_at = self._tokens(prompt_ids, max_new_tokens, Sampler(sampling),
                                                stop_at_eos, stream, text)
        stats = generation_stats(started, first_at, time.perf_counter(), len(prompt_ids),
                                 len(tokens), encode_s or 0.0)
        if encode_s is not None:
            stats["encode_s"] = encode_s
        written = self._text.usable() if text is None else None
        decoded = text.finish() if text is not None else (
            written.decode(tokens) if written is not None else None)
        return GenerationResult(prompt_ids, tokens, decoded, reason, stats)

    def _tokens(self, prompt_ids: list[int], max_new_tokens: int, sample: Sampler,
                stop_at_eos: bool, stream, text: StoppingText | None
                ) -> tuple[list[int], str, float | None]:
        """The new tokens, why they stopped, and when the first came."""
        # the last new token is never fed back: it needs no slot of the cache
        budget = min(max_new_tokens, self.max_context - len(prompt_ids) + 1)
        logits = self.prefill_prompt(prompt_ids)
        tokens: list[int] = []
        first_at = None
        reason = "max_new_tokens" if budget == max_new_tokens else "context_full"
        forced = forced_tokens(self.config, len(prompt_ids), max_new_tokens)
        for token in self._new_tokens(logits, len(prompt_ids), sample, forced, budget):
            first_at = first_at or time.perf_counter()
            if stop_at_eos and token in self.eos:
                return tokens, "eos", first_at
            tokens.append(token)
            if text is None and stream is not None:  # no tokenizer: ids only
                stream(token, None)
            if text is not None and text.add(tokens):
                return tokens, "stop_string", first_at
        return tokens, reason, first_at

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
        notes = [] if self._said.get("config") else [", ".join(unapplied(self.config))]
        notes = [f"the checkpoint's generation config sets {n}, which this generator does not "
                 "apply" for n in notes if n]
        note = sampling_note(self.config, sampling)
        if note and not self._said.get("sampling"):
            notes.append(note)
            self._said["sampling"] = True
        self._said["config"] = True
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
