"""Typed errors shared by every room.

The runtime is the bottom floor, so the error hierarchy lives here and the
exporter extends it. Every error a user can cause carries: what went wrong,
where (a file, an input name, a source line), and what to try. The CLI maps
``exit_code`` to the process exit status and prints ``str(error)`` as one
paragraph; our own bugs are not ``ToolchainError`` and propagate as tracebacks.
"""

from __future__ import annotations


class ToolchainError(Exception):
    """Base of every error the toolchain raises on purpose."""

    exit_code = 3

    def __init__(self, what: str, *, where: str | None = None, hint: str | None = None,
                 details: list[str] | None = None) -> None:
        self.what = what
        self.where = where
        self.hint = hint
        self.details = list(details or [])
        super().__init__(self.paragraph())

    def __str__(self) -> str:
        # From the fields as they are now: a raiser may set ``hint`` or ``where`` after
        # construction (targets/onnx names its report), and the CLI prints str(error).
        return self.paragraph()

    def paragraph(self) -> str:
        parts = [self.what.rstrip(".") + "."]
        if self.where:
            parts.append(f"Where: {self.where}.")
        text = " ".join(parts)
        if self.details:
            text += "\n" + "\n".join(f"  - {line}" for line in self.details)
        if self.hint:
            text += f"\nTry: {self.hint}"
        return text


class UserInputError(ToolchainError):
    """Bad usage or bad input: exit code 2."""

    exit_code = 2


class ArtifactError(UserInputError):
    """The artifact file is malformed, truncated, tampered with or hostile."""


class CompatibilityError(UserInputError):
    """The artifact was built for another machine or toolchain than this one."""


class InputMismatchError(UserInputError):
    """Inputs given to a Program do not match its signature."""


class ExecutionError(ToolchainError):
    """A backend failed while running a partition (exit code 3)."""


def did_you_mean(word: str, choices, *, cutoff: float = 0.6) -> str:
    """`` (did you mean 'onnx'?)`` for the choice nearest ``word``, or "": what every
    refusal of a name among known ones (a target, a recipe, a file, a platform) appends.
    Case is compared last: ``ONNX`` finds 'onnx' before any spelling does."""
    import difflib
    choices = [str(c) for c in choices]
    by_case = {c.lower(): c for c in choices}
    if word.lower() in by_case and by_case[word.lower()] != word:
        return f" (did you mean '{by_case[word.lower()]}'?)"
    close = difflib.get_close_matches(word.lower(), list(by_case), n=1, cutoff=cutoff)
    return f" (did you mean '{by_case[close[0]]}'?)" if close else ""
