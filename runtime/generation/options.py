"""``generate``'s keyword options, checked before any work: a value of the wrong type is
the caller's mistake (a UserInputError naming the option), never an AttributeError from
deep inside the loop."""

from __future__ import annotations

import dataclasses
import numbers

from runtime.errors import UserInputError
from runtime.generation.sampling import Sampling


def checked_sampling(value, where: str) -> Sampling:
    """A Sampling; a dict of its fields is taken as one (checked as Sampling checks)."""
    if value is None:
        return Sampling()
    if isinstance(value, Sampling):
        return value
    if isinstance(value, dict):
        fields = {f.name for f in dataclasses.fields(Sampling)}
        unknown = sorted(str(k) for k in value if k not in fields)
        if unknown:
            raise UserInputError(f"sampling has unknown key(s): {', '.join(unknown)}",
                                 where=where, hint=f"give {', '.join(sorted(fields))}")
        return Sampling(**value)
    raise UserInputError(f"sampling is a {type(value).__name__}", where=where,
                         hint="give runtime.generation.sampling.Sampling(temperature=..., "
                              "top_k=..., top_p=..., seed=...) or a dict of those keys")


def check_options(where: str, *, max_new_tokens, stop_at_eos, stream, language,
                  task) -> None:
    """The options other than the prompt, the source, the sampling and the stop strings
    (runtime/generation/stopping.py checks those)."""
    if max_new_tokens is not None and (not isinstance(max_new_tokens, numbers.Integral)
                                       or isinstance(max_new_tokens, bool)
                                       or max_new_tokens < 0):
        raise UserInputError(f"max_new_tokens is {max_new_tokens!r}", where=where,
                             hint="give a whole number, 0 or more")
    if not isinstance(stop_at_eos, bool):
        raise UserInputError(f"stop_at_eos is a {type(stop_at_eos).__name__}", where=where,
                             hint="give True or False")
    if stream is not None and not callable(stream):
        raise UserInputError(f"stream is a {type(stream).__name__}, not a function",
                             where=where, hint="give a function (token, text) -> None, or None")
    for name, value in (("language", language), ("task", task)):
        if value is not None and not isinstance(value, str):
            raise UserInputError(f"{name} is a {type(value).__name__}", where=where,
                                 hint=f"give the {name} as a string, or None")
