"""Stop strings and the stream: what of the growing text may be handed out, and where a
stop string cuts it.

The result's text ends before the first stop string (as vLLM's and llama.cpp's servers
return it); its tokens run to the one whose text completed the stop string. A streamed
piece could begin a stop string that only the next tokens complete, so the stream holds
back the last ``len(longest stop) - 1`` characters until they are known not to (vLLM's
output buffer), and the pieces it hands out join to exactly the result's text: the text
held back at the end comes in a last call with no token. Without stop strings nothing is
held back.
"""

from __future__ import annotations

from typing import Callable, Sequence

from runtime.errors import UserInputError
from runtime.generation.tokenizer import IncrementalText, Tokenizer

Stream = Callable[[int | None, str | None], None]


def checked_stops(stop: Sequence[str] | str | None, where: str) -> tuple[str, ...]:
    """The stop strings as a tuple; an empty one (it would stop at the first token) and a
    bare string (its characters taken one by one) are refused."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        raise UserInputError("stop must be a list of strings, not one string",
                             where=where, hint=f"stop=[{stop!r}]")
    try:
        stops = tuple(stop)
    except TypeError:
        raise UserInputError(f"stop is a {type(stop).__name__}", where=where,
                             hint="give a list of strings") from None
    if any(not isinstance(s, str) or not s for s in stops):
        raise UserInputError("a stop string is empty or not a string", where=where,
                             hint="give non-empty strings, or none")
    return stops


class StoppingText:
    def __init__(self, tokenizer: Tokenizer, stops: tuple[str, ...], stream: Stream | None):
        self.growing = IncrementalText(tokenizer)
        self.stops = stops
        self.stream = stream
        self.hold = max(map(len, stops), default=1) - 1
        self.sent = 0  # characters of the text handed to the stream
        self.cut: int | None = None  # where the first stop string begins

    def add(self, tokens: list[int]) -> bool:
        """Take the newest token (``tokens`` is all of them so far), stream what can no
        longer start a stop string; True once a stop string is in the text."""
        self.growing.extend(tokens)
        text = self.growing.text
        found = [text.find(s) for s in self.stops if s in text]
        if found:
            self.cut = min(found)
        if self.stream is not None:
            end = self.cut if self.cut is not None else len(text) - self.hold
            self.stream(tokens[-1], text[self.sent:end] if end > self.sent else "")
            self.sent = max(self.sent, end)
        return self.cut is not None

    def finish(self) -> str:
        """The result's text; the stream gets what it still held back."""
        text = self.growing.text
        end = self.cut if self.cut is not None else len(text)
        if self.stream is not None and end > self.sent:
            self.stream(None, text[self.sent:end])
            self.sent = end
        return text[:end]
