"""The encoder-decoder side of ``Generator`` (Whisper, BART, T5, ...): the source encoded
into the cross-attention cache, and the decoder's prompt (runtime/generation/
prompting.py builds a speech model's)."""

from __future__ import annotations

import torch

from runtime.errors import UserInputError
from runtime.generation.audio import Waveform, checked_features, log_mel
from runtime.generation.layout import shortest_source
from runtime.generation.prompting import speech_prompt, takes_language, token_ids


class EncoderSide:
    """Mixed into ``Generator``: uses its cache, steps, tokenizer and checks."""

    def set_source(self, source) -> int:
        """Encode ``source`` into the cross-attention cache; returns its length in rows.
        Text (the artifact's tokenizer) or token ids for a text encoder; input features
        ([mel bins, frames], optionally with a batch of 1) or a ``Waveform`` for Whisper.
        Takes ``lock``; what it encoded stays in this generator's cache for the steps
        that follow (hold ``lock`` across both where other threads use this generator)."""
        with self.holding():
            return self._set_source(source)

    def _set_source(self, source) -> int:
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
            given = None if isinstance(source, str) else _as_ids_tensor(source, self.where)
            if given is not None and given.numel() and given.is_floating_point():
                raise UserInputError("this artifact's encoder takes text or token ids, not "
                                     "input features", where=self.where,
                                     hint="give --source TEXT or --source-ids 1,2,3")
            ids = self._token_ids(source if given is None else given.reshape(-1).tolist(),
                                  spec["bound"])
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
            ids = (self.tokenizer.encode(prompt, special=False, max_tokens=self.max_context)
                   if isinstance(prompt, str) else token_ids(prompt, self.where))
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


def _as_ids_tensor(source, where: str) -> torch.Tensor:
    try:
        return torch.as_tensor(source)
    except (TypeError, ValueError, RuntimeError):
        raise UserInputError(f"the source is a {type(source).__name__}", where=where,
                             hint="give text, token ids, or input features") from None
