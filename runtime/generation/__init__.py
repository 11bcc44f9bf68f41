"""Generation over an artifact built with ``--task text-generation``: the cache layout
(layout.py), the runtime's KV cache (cache.py), the prefill/decode loop (generator.py),
sampling, the tokenizer, and what the build's validation runs (check.py)."""

from __future__ import annotations

from runtime.errors import UserInputError


def parse_prompt(text: str | None, ids: str | None, *, optional: bool = False
                 ) -> str | list[int] | None:
    """A prompt from the command line: text, or comma-separated token ids (one of them).
    ``optional``: none may be given (an encoder-decoder's decoder starts on its own)."""
    if text is not None and ids is not None or (text is None and ids is None
                                                 and not optional):
        raise UserInputError("give the prompt as --prompt TEXT or --prompt-ids 1,2,3 (one "
                             "of them)", hint="--prompt-ids needs no tokenizer")
    if text is None and ids is None:
        return None
    if text is not None:
        return text
    return _ids(ids, "--prompt-ids")


def parse_source(text: str | None, ids: str | None, features: str | None,
                 audio: str | None = None):
    """An encoder-decoder's source from the command line (at most one): text, token ids,
    a file of input features (.npy, or a .safetensors holding one tensor), or a WAV file
    (Whisper); None: none."""
    given = [value for value in (text, ids, features, audio) if value is not None]
    if len(given) > 1:
        raise UserInputError("give the source once: --source TEXT, --source-ids 1,2,3, "
                             "--source-features FILE or --source-audio FILE.wav")
    if audio is not None:
        from runtime.generation.audio import read_wav
        return read_wav(audio)
    if ids is not None:
        return _ids(ids, "--source-ids")
    if features is not None:
        return _features(features)
    return text


def _features(path_text: str):
    from pathlib import Path

    import torch
    path = Path(path_text)
    if not path.is_file():
        raise UserInputError(f"--source-features {path_text}: no such file")
    try:
        if path.suffix == ".npy":
            import numpy
            return torch.from_numpy(numpy.load(path, allow_pickle=False))
        from runtime.host.tensorio import load_tensors
        tensors = load_tensors(path)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the user's input
        raise UserInputError(f"--source-features {path_text} cannot be read "
                             f"({type(exc).__name__}: {str(exc)[:120]})",
                             hint="a .npy array or a .safetensors file") from None
    if len(tensors) != 1:
        raise UserInputError(f"--source-features {path_text} holds {len(tensors)} tensors",
                             hint="save the input features alone")
    return next(iter(tensors.values()))


def _ids(ids: str, flag: str) -> list[int]:
    try:
        # an empty field ("1,,2") is a typo, not nothing: refused as any non-integer
        tokens = [int(part) for part in ids.replace(" ", "").strip(",").split(",")]
    except ValueError:
        raise UserInputError(f"{flag} {ids!r} is not a list of integers",
                             hint=f"e.g. {flag} 1,415,2936") from None
    if not tokens or any(t < 0 for t in tokens):
        raise UserInputError(f"{flag} {ids!r} must hold one or more non-negative ids")
    return tokens
