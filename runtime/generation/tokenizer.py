"""The artifact's own tokenizer: ``tokenizer.json``, read with the ``tokenizers`` package
(an optional runtime extra: ``pip install 'edge-exporter[generate]'``). Token ids in and out
need no tokenizer; text does."""

from __future__ import annotations

from runtime.errors import ArtifactError, CompatibilityError, UserInputError

MAX_TOKENIZER_BYTES = 64 << 20


def read_tokenizer(generation: dict, reader, *, where: str) -> str | None:
    """The tokenizer's JSON text from its (hash-checked) entry, or None when the build had
    no tokenizer."""
    entry = generation.get("tokenizer")
    if entry is None:
        return None
    if not isinstance(entry, str) or entry not in reader.names():
        raise ArtifactError(f"the generation section names tokenizer {entry!r}, which is not "
                            "an entry of the artifact", where=where,
                            hint="rebuild the artifact with `exporter build`")
    data = reader.read_bytes(entry)
    if len(data) > MAX_TOKENIZER_BYTES:
        raise ArtifactError(f"the tokenizer is {len(data)} bytes, over the "
                            f"{MAX_TOKENIZER_BYTES} limit", where=where)
    return data.decode("utf-8")


def tokenizers_installed() -> bool:
    """Whether the ``tokenizers`` package imports here (a device may lack it: token ids in
    and out need none)."""
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        return False
    return True


class Tokenizer:
    def __init__(self, json_text: str | None, *, where: str) -> None:
        if json_text is None:
            raise UserInputError("this artifact was built without a tokenizer, so it takes "
                                 "token ids, not text", where=where,
                                 hint="give token ids (--prompt-ids 1,2,3), or rebuild from a "
                                      "checkpoint folder holding tokenizer.json")
        if not tokenizers_installed():
            raise CompatibilityError("text (a prompt, a source, stop strings) needs the "
                                     "'tokenizers' package", where=where,
                                     hint="pip install tokenizers (or the runtime's "
                                          "'generate' extra); token ids work without it")
        from tokenizers import Tokenizer as HfTokenizer
        self._tokenizer = HfTokenizer.from_str(json_text)

    def encode(self, text: str, special: bool = True) -> list[int]:
        """``special``: with the tokenizer's template (bos, eos) around the text."""
        return self._tokenizer.encode(text, add_special_tokens=special).ids

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)


class IncrementalText:
    """The text of a growing list of tokens, a constant amount of work per token.

    Decoding the whole continuation at every token is quadratic (2,000 tokens: 2,000
    decodes of up to 2,000 ids). Here only a short window is decoded: the new piece is
    ``decode(window) - decode(window without the newest tokens)``, where the window starts
    a few tokens back so a tokenizer that treats a sequence's first token differently
    (SentencePiece's leading space) decodes the new tokens as in the whole text. A piece
    ending in U+FFFD (a character split over tokens) waits for its next token. The
    method of vLLM's and transformers' streaming detokenizers.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.text = ""
        self._prefix = 0  # the window's first token
        self._read = 0  # tokens whose text is in self.text

    def extend(self, tokens: list[int]) -> str:
        """The text that ``tokens`` (all of them so far) adds; "" while a piece waits."""
        decode = self.tokenizer.decode
        before = decode(tokens[self._prefix:self._read])
        now = decode(tokens[self._prefix:])
        if len(now) <= len(before) or now.endswith("\ufffd"):
            return ""
        piece = now[len(before):]
        self.text += piece
        self._prefix, self._read = self._read, len(tokens)
        return piece
