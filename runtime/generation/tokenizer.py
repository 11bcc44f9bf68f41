"""The artifact's own tokenizer: ``tokenizer.json``, read with the ``tokenizers`` package
(an optional runtime extra: ``pip install 'edge-exporter[generate]'``). Token ids in and out
need no tokenizer; text does."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import threading
from typing import Iterator

from runtime.errors import ArtifactError, CompatibilityError, ToolchainError, UserInputError

log = logging.getLogger(__name__)

MAX_TOKENIZER_BYTES = 64 << 20


def read_tokenizer(entry: str | None, reader, *, where: str) -> str | None:
    """The tokenizer's JSON text from its (hash-checked) entry, the generation section's
    ``tokenizer``, or None when the build had no tokenizer."""
    if entry is None:
        return None
    if entry not in reader.names():
        raise ArtifactError(f"the generation section names tokenizer {entry!r}, which is not "
                            "an entry of the artifact", where=where,
                            hint="rebuild the artifact with `exporter build`")
    data = reader.read_bytes(entry)
    if len(data) > MAX_TOKENIZER_BYTES:
        raise ArtifactError(f"the tokenizer is {len(data)} bytes, over the "
                            f"{MAX_TOKENIZER_BYTES} limit", where=where)
    # not UTF-8: kept as text that will not parse, so ids still generate (ArtifactText)
    return data.decode("utf-8", errors="replace")


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
        self.where = where
        with _failures_as_errors("cannot be read", where), _panic_text_held():
            self._tokenizer = HfTokenizer.from_str(json_text)
        # each token covers at most this many characters of text (byte-level BPE: bytes)
        self.longest = max(map(len, self._tokenizer.get_vocab(with_added_tokens=True)),
                           default=1)

    def encode(self, text: str, special: bool = True, max_tokens: int | None = None
               ) -> list[int]:
        """``special``: with the tokenizer's template (bos, eos) around the text.
        ``max_tokens``: a text too long to give that many tokens is refused untokenized
        (a slow pre-tokenizer's time grows with the text)."""
        if max_tokens is not None and len(text) > 4 * max_tokens * self.longest + 64:
            raise UserInputError(f"the text has {len(text)} characters, more than "
                                 f"{max_tokens} tokens of this tokenizer can hold",
                                 where=self.where, hint="shorten the text")
        with _failures_as_errors("failed on the text", self.where), _panic_text_held():
            return self._tokenizer.encode(text, add_special_tokens=special).ids

    def decode(self, ids: list[int]) -> str:
        with _failures_as_errors("failed decoding the new tokens", self.where):
            return self._tokenizer.decode(ids, skip_special_tokens=True)


@contextlib.contextmanager
def _failures_as_errors(doing: str, where: str) -> Iterator[None]:
    """The artifact's tokenizer.json is data from the artifact: whatever the tokenizers
    library raises over it is an ArtifactError. That includes a Rust panic (a pre-tokenizer
    regex that backtracks past its limit), which pyo3 raises as PanicException, a
    BaseException: ``except Exception`` lets it through to a traceback."""
    try:
        yield
    except ToolchainError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the library on artifact data
        raise _error(doing, exc, where) from None
    except BaseException as exc:
        if type(exc).__name__ != "PanicException":
            raise
        raise _error(doing, exc, where) from None


_STDERR = threading.Lock()


@contextlib.contextmanager
def _panic_text_held() -> Iterator[None]:
    """Rust's panic hook writes the panic (and with RUST_BACKTRACE its backtrace) to file
    descriptor 2 before Python sees the exception, which would put lines beside the one
    error paragraph: fd 2 goes to a file meanwhile, written out after unless it panicked
    (the error then carries the panic's message)."""
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to keep clean
        yield
        return
    panicked = False
    with _STDERR, tempfile.TemporaryFile() as held:
        sys.stderr.flush()
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException as exc:
            panicked = type(exc).__name__ == "PanicException"
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read()
            if text and not panicked:
                os.write(2, text)


def _error(doing: str, exc: BaseException, where: str) -> ArtifactError:
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return ArtifactError(f"the artifact's tokenizer (tokenizer.json) {doing} "
                         f"({type(exc).__name__}: {first})", where=where,
                         hint="give token ids (--prompt-ids 1,2,3; ids come out as ids), or "
                              "rebuild the artifact from a checkpoint whose tokenizer.json "
                              "loads in transformers")


class ArtifactText:
    """A program's tokenizer, parsed on first use and shared by its generators: ``get``
    for what needs text (raises why it cannot), ``usable`` for output that can fall back
    to ids (None, said once, when the tokenizer is missing, its package is not installed
    or it cannot be read)."""

    def __init__(self, json_text: str | None, where: str) -> None:
        self.json_text = json_text
        self.where = where
        self._tokenizer: Tokenizer | None = None
        self._said = False
        self._lock = threading.Lock()

    def get(self) -> Tokenizer:
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = Tokenizer(self.json_text, where=self.where)
            return self._tokenizer

    def usable(self) -> Tokenizer | None:
        if self.json_text is None:
            return None
        if self._tokenizer is None and not tokenizers_installed():
            self._say("the 'tokenizers' package is not installed: the new tokens come out "
                      "as ids, not text (pip install tokenizers)")
            return None
        try:
            return self.get()
        except ArtifactError as exc:
            self._say(f"{exc.what}; the new tokens come out as ids, not text")
            return None

    def _say(self, line: str) -> None:
        if not self._said:
            self._said = True
            log.warning(line)


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
