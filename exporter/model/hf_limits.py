"""How big an ``hf:`` config's model would be, known before a byte of it is allocated.

A hostile or mistyped ``config.json`` (a vocabulary of 10^9, 100,000 layers, 0 heads, a
negative size) would otherwise allocate until the machine kills the build, or end in a
traceback deep inside transformers. Three checks, cheapest first:

1. no size-like integer is negative, the core ones (width, heads, vocabulary)
   are not zero, and layer counts are plausible;
2. a quick estimate from the common fields (embeddings, then 12·hidden² per layer);
3. the exact parameter count of the model built on PyTorch's ``meta`` device (shapes,
   no storage: how accelerate's ``init_empty_weights`` sizes checkpoints), in float32
   bytes, against the limit (``--max-model-size``, default half this machine's memory).
"""

from __future__ import annotations

import os

import torch

from exporter.errors import SpecError

MAX_LAYERS = 1024  # the largest released models have under 200 layers
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers",
               "decoder_layers", "n_layers", "num_decoder_layers")
_WIDTH_KEYS = ("hidden_size", "d_model", "n_embd", "dim", "embed_dim")
# Zero is a legal value of some size-like fields (type_vocab_size, max_window_layers...),
# never of these: a model with no width, heads or vocabulary divides by zero or is empty.
_NEVER_ZERO = {"vocab_size", "hidden_size", "d_model", "n_embd", "num_attention_heads",
               "n_head", "num_heads", "num_key_value_heads", "encoder_attention_heads",
               "decoder_attention_heads", "intermediate_size", "head_dim"}
_SIZE_ENDINGS = ("_size", "_layers", "_heads", "_dim", "n_embd", "n_layer", "n_head",
                 "_channels", "d_model", "d_ff", "_positions", "_embeddings")


def default_limit() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def check_config_size(config, auto_class, limit: int | None, where: str) -> int:
    """Refuse (SpecError, exit 2) a config whose model is implausible or over ``limit``
    bytes of float32 parameters; returns those bytes."""
    limit = limit or default_limit()
    hint = ("check config.json; if the model really is this large, raise --max-model-size "
            f"(now {limit / 2**30:.1f} GiB)")
    values = _int_fields(config)
    bad = sorted(f"{key} = {value}" for key, value in values.items()
                 if (key.endswith(_SIZE_ENDINGS) and value < 0)
                 or (key in _NEVER_ZERO and value == 0))
    if bad:
        raise SpecError(f"config.json has sizes that are zero or negative: {', '.join(bad)}",
                        where=where, hint="fix config.json: sizes and counts are positive")
    layers = max((values.get(k, 0) for k in _LAYER_KEYS), default=0)
    if layers > MAX_LAYERS:
        raise SpecError(f"config.json asks for {layers} layers, over the {MAX_LAYERS} this "
                        "tool builds", where=where, hint="check config.json")
    estimate = _estimate(values) * 4
    if estimate > limit:
        raise SpecError(f"config.json describes a model of about {estimate / 2**30:.1f} GiB "
                        f"of float32 weights, over the {limit / 2**30:.1f} GiB limit",
                        where=where, hint=hint)
    exact = _meta_bytes(config, auto_class, where)
    if exact > limit:
        raise SpecError(f"config.json describes a model of {exact / 2**30:.1f} GiB of float32 "
                        f"weights, over the {limit / 2**30:.1f} GiB limit", where=where,
                        hint=hint)
    return exact


def _int_fields(config) -> dict[str, int]:
    """Integer fields of the config and of its sub-configs (text_config, vision_config...)."""
    found: dict[str, int] = {}
    raw = config.to_dict() if hasattr(config, "to_dict") else dict(vars(config))
    todo = [raw]
    while todo:
        for key, value in todo.pop().items():
            if isinstance(value, dict):
                todo.append(value)
            elif type(value) is int:
                found[key] = max(found.get(key, value), value)
    return found


def _estimate(values: dict[str, int]) -> int:
    width = max((values.get(k, 0) for k in _WIDTH_KEYS), default=0)
    layers = max((values.get(k, 0) for k in _LAYER_KEYS), default=0)
    vocab = values.get("vocab_size", 0)
    ffn = values.get("intermediate_size") or 4 * width
    return vocab * width + layers * (4 * width * width + 3 * width * ffn)


def _meta_bytes(config, auto_class, where: str) -> int:
    try:
        with torch.device("meta"):
            model = auto_class.from_config(config, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - transformers' own code on the user's config
        raise SpecError(f"transformers cannot build a model from config.json "
                        f"({type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]})",
                        where=where, hint="check config.json's sizes and model_type") from None
    return sum(p.numel() for p in model.parameters()) * 4
