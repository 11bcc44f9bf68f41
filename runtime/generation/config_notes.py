"""What a checkpoint's generation config (``generation_config.json``, carried in the
artifact) asks of transformers' ``generate`` beyond what this generator does: said once,
not dropped in silence. An outside check found a ``repetition_penalty`` of 1.5 ignored
without a word, the tokens then differing from ``model.generate(ids)`` at the 13th.

The generator applies: eos ids, ``suppress_tokens``/``begin_suppress_tokens``,
``forced_bos_token_id``/``forced_eos_token_id``, Whisper's prompt, and ``max_new_tokens`` as
the default length. Sampling is the caller's choice
(greedy unless asked), so a config that samples gets a note saying how to sample as it does.
"""

from __future__ import annotations

from runtime.generation.sampling import Sampling

DEFAULT_NEW_TOKENS = 128

# settings that change the tokens of transformers' generate, with their neutral values
_NEUTRAL = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "num_beams": 1,
            "encoder_repetition_penalty": 1.0, "encoder_no_repeat_ngram_size": 0,
            "min_new_tokens": 0, "min_length": 0, "bad_words_ids": None, "sequence_bias": None,
            "min_p": None,
            "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "penalty_alpha": None,
            "exponential_decay_length_penalty": None, "guidance_scale": None}


def default_new_tokens(config: dict) -> int:
    """``max_new_tokens`` when the caller gives none: the checkpoint's, as ``generate``."""
    value = config.get("max_new_tokens")
    return value if isinstance(value, int) and value >= 0 else DEFAULT_NEW_TOKENS


def unapplied(config: dict) -> list[str]:
    """``name=value`` of each config setting this generator does not apply."""
    return [f"{name}={config[name]}" for name, neutral in _NEUTRAL.items()
            if config.get(name) not in (None, neutral)]


def sampling_note(config: dict, sampling: Sampling) -> str | None:
    """A greedy call on a checkpoint whose config samples: how to sample as it does."""
    if not sampling.greedy or not config.get("do_sample"):
        return None
    flags = [f"--{name.replace('_', '-')} {config[name]}" for name in
             ("temperature", "top_k", "top_p") if config.get(name) is not None]
    asked = " ".join(flags) or "--temperature 1"
    return (f"the checkpoint's generation config samples (do_sample), and this run is greedy; "
            f"to sample as it does: {asked} (Python: sampling=Sampling(...))")


def forced_tokens(config: dict, prompt: int, max_new_tokens: int) -> dict[int, int]:
    """{new token's index: id} the generation config forces, as transformers' generate
    does: ``forced_bos_token_id`` first after a one-token prompt (mBART-50's and M2M100's
    target language), ``forced_eos_token_id`` as the last of ``max_new_tokens`` (BART's)."""
    def first(value):
        value = value[0] if isinstance(value, (list, tuple)) and value else value
        return value if isinstance(value, int) else None
    forced = {}
    eos, bos = first(config.get("forced_eos_token_id")), first(config.get("forced_bos_token_id"))
    if eos is not None and max_new_tokens > 0:
        forced[max_new_tokens - 1] = eos
    if bos is not None and prompt == 1:
        forced[0] = bos
    return forced
