"""Choosing the next token from logits: greedy, or sampled with temperature, top-k and
top-p, from a seeded generator (the same seed gives the same tokens on any device: the
draw happens on the CPU).

Written here rather than taken from transformers' logits processors: the runtime runs on
devices without transformers, and these four rules are the whole of what it needs.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from runtime.errors import UserInputError


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0: greedy
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        problems = []
        if not _number(self.temperature) or not 0.0 <= self.temperature <= 100.0:
            problems.append(f"temperature {self.temperature!r} (give 0 for greedy, or up to "
                            "100)")
        if self.top_k is not None and (not _integer(self.top_k) or self.top_k < 1):
            problems.append(f"top_k {self.top_k!r} (give a whole number, 1 or more)")
        if self.top_p is not None and (not _number(self.top_p) or not 0.0 < self.top_p <= 1.0):
            problems.append(f"top_p {self.top_p!r} (give a number in (0, 1])")
        if self.seed is not None and (not _integer(self.seed) or not 0 <= self.seed < 2**64):
            problems.append(f"seed {self.seed!r} (give a whole number from 0 to 2**64 - 1)")
        if problems:
            raise UserInputError("sampling settings out of range: " + "; ".join(problems),
                                 hint="temperature >= 0, top_k >= 1, 0 < top_p <= 1, "
                                      "0 <= seed < 2**64")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class Sampler:
    def __init__(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self._generator = None
        if not sampling.greedy:
            self._generator = torch.Generator()
            if sampling.seed is not None:
                self._generator.manual_seed(int(sampling.seed))
            else:
                self._generator.seed()

    def __call__(self, logits: torch.Tensor) -> int:
        """The next token from one position's logits [vocab]."""
        if self.sampling.greedy:
            return int(logits.argmax())
        return int(self.sample(logits.float().cpu()))

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        s = self.sampling
        # from the largest logit down: a temperature of 1e-45 gives -inf and 0, not inf/inf
        scores = (logits - logits.max()) / s.temperature
        if s.top_k is not None and s.top_k < scores.numel():
            kth = torch.topk(scores, s.top_k).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if s.top_p is not None and s.top_p < 1.0:
            ordered, order = torch.sort(scores, descending=True)
            cumulative = torch.softmax(ordered, dim=-1).cumsum(-1)
            # keep the smallest prefix whose mass reaches top_p (the first token always)
            drop = cumulative - torch.softmax(ordered, dim=-1) >= s.top_p
            scores = scores.scatter(0, order, ordered.masked_fill(drop, float("-inf")))
        probs = torch.softmax(scores, dim=-1)
        return torch.multinomial(probs, 1, generator=self._generator)[0]


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _integer(value) -> bool:  # numpy's integers too
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
