"""Generation over an artifact built with ``--task text-generation``: the cache layout
(layout.py), the runtime's KV cache (cache.py), the prefill/decode loop (generator.py),
sampling, the tokenizer, and what the build's validation runs (check.py)."""

from __future__ import annotations

from runtime.errors import UserInputError


def parse_prompt(text: str | None, ids: str | None) -> str | list[int]:
    """A prompt from the command line: text, or comma-separated token ids (one of them)."""
    if (text is None) == (ids is None):
        raise UserInputError("give the prompt as --prompt TEXT or --prompt-ids 1,2,3 (one "
                             "of them)", hint="--prompt-ids needs no tokenizer")
    if text is not None:
        return text
    try:
        tokens = [int(part) for part in ids.replace(" ", "").split(",") if part]
    except ValueError:
        raise UserInputError(f"--prompt-ids {ids!r} is not a list of integers",
                             hint="e.g. --prompt-ids 1,415,2936") from None
    if not tokens or any(t < 0 for t in tokens):
        raise UserInputError(f"--prompt-ids {ids!r} must hold one or more non-negative ids")
    return tokens
