"""What an artifact's generation config (Hugging Face's, carried in the manifest) asks of
``generate`` besides the sampling: a speech model's decoder prompt, and tokens never to
emit; and a prompt's token ids as callers give them.

Whisper does not start from its decoder start token alone: transformers' Whisper
``generate`` prompts ``<|startoftranscript|> <|lang|> <|task|> <|notimestamps|>``, taking
the language and task from the call, the config, or its older ``forced_decoder_ids``, and
detecting the language from the audio when none is given (its
``_retrieve_init_tokens`` and ``detect_language``, transformers 5.x). ``speech_prompt``
builds the same prompt; the artifact does no timestamps, so ``<|notimestamps|>`` always
ends it.

``suppress_tokens`` and ``begin_suppress_tokens`` are generation-config fields that
``generate`` applies to every model that sets them (Whisper's checkpoints do): those ids
never come out, and the second list not as the first new token. The build's validation
compares the raw greedy choice (the config set aside); ``generate`` applies them.

Written here, not taken from transformers: the runtime runs where transformers is not
installed, and these rules are short.
"""

from __future__ import annotations

import numbers
from typing import Callable, Sequence

import torch

from runtime.errors import UserInputError

TASKS = ("transcribe", "translate")


def takes_language(config: dict) -> bool:
    """Whether the model's prompt names a language and a task (Whisper's checkpoints)."""
    return bool(config.get("lang_to_id")) and bool(config.get("task_to_id"))


def speech_prompt(config: dict, start: Sequence[int], language: str | None,
                  task: str | None, detect: Callable[[list[int], list[int]], int],
                  where: str) -> list[int]:
    """The decoder prompt transformers' Whisper ``generate`` makes. ``detect(prompt,
    candidates)``: the candidate the model scores highest after ``prompt`` (the
    language, when none is given)."""
    language = language if language is not None else config.get("language")
    task = task if task is not None else config.get("task")
    prompt: list[int | None] = list(start)
    if language is None and task is None:  # the older config field, as transformers reads it
        forced = sorted((int(i), t) for i, t in config.get("forced_decoder_ids") or [])
        for index, token in forced:
            if index != len(prompt):
                break
            prompt.append(None if token is None else int(token))
    lang_to_id = {str(k): int(v) for k, v in config["lang_to_id"].items()}
    task_to_id = {str(k): int(v) for k, v in config["task_to_id"].items()}
    if language is not None:
        lang = _language_id(language, lang_to_id, config.get("language_codes") or {},
                            where)
    elif len(prompt) <= 1 or prompt[1] is None:  # undefined: detected from the source
        lang = detect([int(t) for t in prompt[:1]], sorted(lang_to_id.values()))
    else:
        lang = None
    if lang is not None:
        if len(prompt) > 1:
            prompt[1] = lang
        else:
            prompt.append(lang)
    if task is not None:
        if task not in TASKS or task not in task_to_id:
            raise UserInputError(f"task '{task}' is not one this model knows",
                                 where=where, hint=f"give one of: {', '.join(sorted(task_to_id))}")
        wanted = task_to_id[task]
        tasks = set(task_to_id.values())
        if any(t in tasks for t in prompt):
            prompt = [wanted if t in tasks else t for t in prompt]
        else:
            prompt.append(wanted)
    elif language is not None and not any(t in task_to_id.values() for t in prompt):
        prompt.append(task_to_id["transcribe"])
    no_timestamps = config.get("no_timestamps_token_id")
    if no_timestamps is not None and prompt[-1] != int(no_timestamps):
        prompt.append(int(no_timestamps))
    return [int(t) for t in prompt]


def _language_id(language: str, lang_to_id: dict[str, int], names: dict[str, str],
                 where: str) -> int:
    """A language code ("fr"), its token ("<|fr|>") or its name ("French"; ``names`` is
    the table the build recorded, exporter/lm/source.py)."""
    token = language.lower()
    token = names.get(token, token)
    token = token if token.startswith("<|") else f"<|{token}|>"
    if token not in lang_to_id:
        codes = [k.strip("<|>") for k in sorted(lang_to_id)]
        raise UserInputError(f"language '{language}' is not one this model knows",
                             where=where, hint=f"give a language code or name: {', '.join(codes[:12])}"
                                               + (", ..." if len(codes) > 12 else ""))
    return lang_to_id[token]


class Suppression:
    """``suppress_tokens`` (every step) and ``begin_suppress_tokens`` (the first new
    token) of the generation config, as -inf logits."""

    def __init__(self, config: dict, vocab: int, device: str | torch.device = "cpu") -> None:
        def ids(key: str) -> torch.Tensor | None:  # on the logits' device: no copy a token
            kept = sorted({int(t) for t in config.get(key) or [] if 0 <= int(t) < vocab})
            return torch.tensor(kept, dtype=torch.long, device=device) if kept else None
        self.always = ids("suppress_tokens")
        self.at_begin = ids("begin_suppress_tokens")

    def __bool__(self) -> bool:
        return self.always is not None or self.at_begin is not None

    def __call__(self, logits: torch.Tensor, first: bool) -> torch.Tensor:
        """``logits`` [vocab] with the suppressed ids at -inf (a copy where any are)."""
        for index in (self.always, self.at_begin if first else None):
            if index is not None:
                logits = logits.index_fill(0, index, float("-inf"))
        return logits


def token_ids(ids, where: str) -> list[int]:
    """A prompt's token ids: a list, or a tensor or array of [L] or [1, L] (what a
    tokenizer's ``return_tensors`` gives); anything else is the caller's mistake."""
    if hasattr(ids, "shape") and hasattr(ids, "tolist"):  # a tensor or an array
        if len(ids.shape) == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if len(ids.shape) != 1:
            raise UserInputError(f"the prompt's ids have shape {list(ids.shape)}: one "
                                 "sequence is generated at a time", where=where,
                                 hint="give ids of shape [L] or [1, L]")
        ids = ids.tolist()
    try:
        values = list(ids)
    except TypeError:
        raise UserInputError(f"the prompt is a {type(ids).__name__}", where=where,
                             hint="give text or a list of token ids") from None
    # bool is an int (True would be token 1): a list of flags is a mistake, not ids
    if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in values):
        raise UserInputError("the prompt's ids are not all integers", where=where,
                             hint="give token ids as integers (not bools or floats)")
    return [int(t) for t in values]
