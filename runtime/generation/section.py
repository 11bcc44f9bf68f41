"""A generating artifact's ``manifest.generation``, typed: the cache layout, the context and
chunk the build fixed, the token ids, the checkpoint's generation config, an
encoder-decoder's source and the tokenizer's entry.

Parsed once, when the manifest is read, with bounds on every field: a hostile or broken
section fails as an ArtifactError naming the field, never as a KeyError or a TypeError in
the generator. What needs the artifact's programs (the vocabulary, the chunk lengths the
prefill program takes, the cache inputs' shapes, this machine's memory) is checked at load
by runtime/generation/settings.py. Torch-free: an ONNX-only device reads manifests too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runtime.errors import ArtifactError
from runtime.generation.layout import CacheLayout

_HINT = "rebuild the artifact with `exporter build`"
_SOURCE_INPUTS = ("input_ids", "input_features")
_MAX_IDS = 1 << 16  # ids in one list: far above any tokenizer's special tokens
_MAX_ENTRY = 4096  # characters of an entry name


@dataclass(frozen=True)
class GenerationSection:
    cache: CacheLayout
    max_context: int
    prefill_chunk: int
    # {"bos": [...], "eos": [...], "pad": [...], "decoder_start": [...]}, as the build
    # wrote them (``<key>_token_ids`` in the JSON)
    token_ids: dict[str, tuple[int, ...]] = field(default_factory=dict)
    generation_config: dict = field(default_factory=dict)  # the checkpoint's, ids typed
    source: dict | None = None  # an encoder-decoder's encoder input
    tokenizer: str | None = None  # the tokenizer.json entry, or None: ids only
    cache_bytes: int | None = None  # what the build computed, for reports

    @property
    def eos(self) -> frozenset[int]:
        return frozenset(self.token_ids.get("eos", ()))

    @property
    def decoder_start(self) -> list[int]:
        return list(self.token_ids.get("decoder_start", ()))

    def to_json(self) -> dict:
        """The section as the manifest holds it (the JSON the build always wrote)."""
        return {"cache": self.cache.to_json(), "max_context": self.max_context,
                "prefill_chunk": self.prefill_chunk, "tokenizer": self.tokenizer,
                **{f"{key}_token_ids": list(ids) for key, ids in self.token_ids.items()},
                "generation_config": self.generation_config,
                **({"source": self.source} if self.source is not None else {}),
                **({"cache_bytes": self.cache_bytes} if self.cache_bytes is not None
                   else {})}

    @classmethod
    def from_json(cls, raw: Any, *, where: str) -> "GenerationSection":
        """The checked section, or ArtifactError naming the field that is wrong."""
        if not isinstance(raw, dict):
            raise _malformed(f"it is not a JSON object but {type(raw).__name__}", where)
        try:
            cache = CacheLayout.from_json(_required(raw, "cache"))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise _malformed(f"cache: {_said(exc)}", where) from None
        try:
            return cls(cache=cache,
                       max_context=_whole(_required(raw, "max_context"), "max_context"),
                       prefill_chunk=_whole(_required(raw, "prefill_chunk"), "prefill_chunk"),
                       token_ids=_token_ids(raw),
                       generation_config=_config(raw.get("generation_config")),
                       source=_source(raw.get("source")),
                       tokenizer=_entry(raw.get("tokenizer")),
                       cache_bytes=_count(raw.get("cache_bytes"), "cache_bytes"))
        except (KeyError, TypeError, ValueError) as exc:
            raise _malformed(_said(exc), where) from None


def _malformed(problem: str, where: str) -> ArtifactError:
    return ArtifactError(f"the generation section is malformed: {problem}", where=where,
                         hint=_HINT)


def _said(exc: Exception) -> str:
    return f"the key {exc.args[0]!r} is missing" if isinstance(exc, KeyError) else str(exc)


def _required(raw: dict, key: str) -> Any:
    if raw.get(key) is None:
        raise KeyError(key)
    return raw[key]


def _whole(value: Any, what: str) -> int:
    if type(value) is not int or not 0 < value < 1 << 31:
        raise ValueError(f"{what} must be a positive integer, not {value!r:.40}")
    return value


def _count(value: Any, what: str) -> int | None:
    if value is not None and (type(value) is not int or not 0 <= value < 1 << 62):
        raise ValueError(f"{what} must be a non-negative integer, not {value!r:.40}")
    return value


def _ids(value: Any, what: str) -> list[int]:
    """A list of token ids (integers, not bools); None is none. Whether they are inside
    the vocabulary is the programs' to say (settings.py)."""
    if value is None:
        return []
    if (not isinstance(value, list) or len(value) > _MAX_IDS
            or any(type(t) is not int for t in value)):
        raise ValueError(f"{what} must be a list of integers, not {value!r:.60}")
    return list(value)


def _token_ids(raw: dict) -> dict[str, tuple[int, ...]]:
    return {key.removesuffix("_token_ids"): tuple(_ids(value, key))
            for key, value in raw.items() if key.endswith("_token_ids")}


def _entry(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not 0 < len(value) <= _MAX_ENTRY):
        raise ValueError(f"tokenizer must name an entry of the artifact, not {value!r:.60}")
    return value


def _source(value: Any) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("input") not in _SOURCE_INPUTS:
        raise ValueError(f"source must name its input (input_ids or input_features), not "
                         f"{value!r:.60}")
    if value["input"] == "input_ids":
        _whole(value.get("bound"), "source.bound")
        if value.get("shortest") is not None:
            _whole(value["shortest"], "source.shortest")
    else:
        shape = value.get("shape")
        if not isinstance(shape, list) or len(shape) != 2:
            raise ValueError("source.shape must be [mel bins, frames]")
        for size in shape:
            _whole(size, "source.shape")
    return value


def _config(value: Any) -> dict:
    """The config's fields that the generator reads as ids, typed here."""
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"generation_config must be an object, not {type(value).__name__}")
    config = dict(value or {})
    for key in ("suppress_tokens", "begin_suppress_tokens"):
        _ids(config.get(key), f"generation_config.{key}")
    for key in ("lang_to_id", "task_to_id"):
        table = config.get(key)
        if table is not None and (not isinstance(table, dict) or any(
                type(v) is not int for v in table.values())):
            raise ValueError(f"generation_config.{key} must map names to ids")
    for pair in config.get("forced_decoder_ids") or []:
        if not isinstance(pair, list) or len(pair) != 2 or type(pair[0]) is not int or not (
                pair[1] is None or type(pair[1]) is int):
            raise ValueError("generation_config.forced_decoder_ids must be [index, id] pairs")
    return config
