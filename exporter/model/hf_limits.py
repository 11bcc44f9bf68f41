"""How big an ``hf:`` config's model would be, known before a byte of it is allocated.

A hostile or mistyped ``config.json`` (a vocabulary of 10^9, 100,000 layers, 0 heads, a
negative size) would otherwise allocate until the machine kills the build, or end in a
traceback deep inside transformers. Three checks, cheapest first:

1. every size-like field of every table is an integer (not a bool, a string or a fraction),
   none is negative, the core ones (width, heads, vocabulary) are not zero, widths divide
   among heads (exporter/model/hf_fields.py), and layer counts are plausible;
2. a quick estimate from the common fields (embeddings, then 12·hidden² per layer);
3. the exact parameter count of the model built on PyTorch's ``meta`` device (shapes,
   no storage: how accelerate's ``init_empty_weights`` sizes checkpoints), in float32
   bytes, against the limit (``--max-model-size``, default half this machine's memory).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from exporter.errors import SpecError
from exporter.model.hf_fields import relation_problems, size_problems, tables

MAX_LAYERS = 1024  # the largest released models have under 200 layers
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers",
               "decoder_layers", "n_layers", "num_decoder_layers")
_WIDTH_KEYS = ("hidden_size", "d_model", "n_embd", "dim", "embed_dim")
_FIX = ("fix config.json: sizes and counts are positive integers, widths a multiple of "
        "the head count (or head_dim given)")


def read_config(path: Path, where: str) -> dict:
    """config.json as JSON, its sizes checked (exporter/model/hf_fields.py) before
    transformers reads it: a fraction, a string, a bool or a zero where a size belongs is a
    SpecError naming each field, whatever transformers would have said."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path} cannot be read ({exc})", where=where) from None
    except ValueError as exc:
        raise SpecError(f"{path} is not valid JSON ({exc})", where=where,
                        hint="fix config.json: it is not valid JSON") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{path} holds a JSON {type(raw).__name__}, not an object", where=where,
                        hint="fix config.json: it is not valid JSON for a config")
    _refuse(size_problems(raw), path.name, where)
    return raw


def first_lines(exc: BaseException, limit: int = 300) -> str:
    """An exception's message on one line (transformers' validation errors put the reason
    on their second line)."""
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return (text[:limit - 3] + "...") if len(text) > limit else text or type(exc).__name__


def _refuse(problems: list[str], name: str, where: str) -> None:
    if problems:
        shown = ", ".join(problems[:8]) + (f" and {len(problems) - 8} more"
                                           if len(problems) > 8 else "")
        raise SpecError(f"{name} has sizes that cannot describe a model: {shown}",
                        where=where, hint=_FIX)


def default_limit() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def check_config_size(config, auto_class, limit: int | None, where: str,
                      given: dict | None = None) -> int:
    """Refuse (SpecError, exit 2) a config whose model is implausible or over ``limit``
    bytes of float32 parameters; returns those bytes. ``given``: config.json as the user
    wrote it (its tables' sizes must fit together; transformers' defaults are not judged)."""
    limit = limit or default_limit()
    hint = ("check config.json; if the model really is this large, raise --max-model-size "
            f"(now {limit / 2**30:.1f} GiB)")
    built = _as_dict(config)
    _refuse(size_problems(built) + relation_problems(built, built if given is None else given),
            "config.json", where)
    values = _int_fields(built)
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


def _as_dict(config) -> dict:
    return config.to_dict() if hasattr(config, "to_dict") else dict(vars(config))


def _int_fields(config: dict) -> dict[str, int]:
    """The largest value of each integer field over the config's tables (for the estimate)."""
    found: dict[str, int] = {}
    for _, table in tables(config):
        for key, value in table.items():
            if type(value) is int:
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
        raise SpecError(f"transformers' {auto_class.__name__} cannot build a model from "
                        f"config.json ({type(exc).__name__}: {first_lines(exc)})",
                        where=where, hint="check config.json's sizes and model_type") from None
    return sum(p.numel() for p in model.parameters()) * 4
