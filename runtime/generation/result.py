"""What ``generate`` returns: the new tokens, their text, why it stopped, and the
phases' times (time to first token, prefill and decode tokens/s)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationResult:
    prompt_tokens: list[int]
    tokens: list[int]  # the new tokens only
    text: str | None  # the new tokens as text, when the artifact has a tokenizer
    stop_reason: str  # "eos", "stop_string", "max_new_tokens", "context_full"
    stats: dict = field(default_factory=dict)  # seconds and tokens/s of each phase

    def to_json(self) -> dict:
        return {"prompt_tokens": len(self.prompt_tokens), "tokens": self.tokens,
                "text": self.text, "stop_reason": self.stop_reason, "stats": self.stats}


def generation_stats(started: float, first_at: float | None, ended: float, prompt: int,
                     new: int, encode_s: float) -> dict:
    """Time to first token counts an encoder's time; prefill's rate does not."""
    ttft = (first_at or ended) - started
    prefill_s = ttft - encode_s
    decode_s = ended - (first_at or ended)
    return {"ttft_s": round(ttft, 6), "prefill_tokens_per_s": round(prompt / prefill_s, 2)
            if prefill_s > 0 else None, "decode_s": round(decode_s, 6),
            "decode_tokens_per_s": round((new - 1) / decode_s, 2)
            if new > 1 and decode_s > 0 else None}
