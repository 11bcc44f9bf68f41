"""Whether an ``hf:`` config's sizes can describe a model at all, known before transformers
reads them.

A ``config.json`` with ``hidden_size: 64.5``, ``num_attention_heads: 0`` in a nested
``text_config``, ``"32"`` for a width or ``true`` for a head count otherwise ends in
transformers' own validation, a ZeroDivisionError or a shape error deep inside a layer.
Every table of the config (the top level and each nested sub-config: text, vision, audio,
encoder, decoder) is checked on its own, so a good size in one cannot hide a bad one in
another:

- a size-like field (its name ends in ``_size``, ``_heads``, ``_dim``, ... or is one of the
  core sizes) holds an integer: not a bool, a string or a fraction; none is negative, and
  the core ones (width, heads, vocabulary, head size) are not zero; lists of sizes hold
  integers; ``null`` is left to transformers' default;
- the width divides among the attention heads unless the table gives the head size itself
  (``head_dim``, ``d_kv``...), and the query heads divide among the key/value heads.
"""

from __future__ import annotations

from typing import Iterator

# Zero is a legal value of some size-like fields (type_vocab_size, max_window_layers...),
# never of these: a model with no width, heads or vocabulary divides by zero or is empty.
CORE = frozenset({
    "vocab_size", "hidden_size", "d_model", "n_embd", "num_attention_heads", "n_head",
    "num_heads", "n_heads", "num_key_value_heads", "num_kv_heads", "encoder_attention_heads",
    "decoder_attention_heads", "intermediate_size", "head_dim", "d_kv", "d_head", "d_ff",
    "num_hidden_layers", "n_layer", "num_layers", "n_layers", "embed_dim", "dim"})
_SIZE_ENDINGS = ("_size", "_layers", "_heads", "_dim", "_channels", "_positions",
                 "_embeddings")
_NEVER_FLAGS = ("_size", "_heads")  # other endings name flags too (cross_attn_all_layers)
# flags and probabilities whose names happen to end like sizes (tie_word_embeddings,
# dropout_positions, mscale_all_dim)
_NOT_SIZES = ("dropout", "scale", "ratio", "prob", "eps", "factor", "rate", "theta",
              "tie_", "use_", "share_", "freeze_")
# tables of a config that hold no model sizes
_SKIPPED_TABLES = frozenset({"rope_scaling", "rope_parameters", "quantization_config",
                             "id2label", "label2id", "task_specific_params"})
_WIDTHS = ("hidden_size", "d_model", "n_embd", "embed_dim", "dim")
_HEADS = ("num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads",
          "decoder_attention_heads")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_head_kv")
_HEAD_SIZES = ("head_dim", "d_kv", "d_head", "attention_head_size", "kv_channels",
               "attention_head_dim", "embedding_size", "qk_head_dim")


def tables(config: dict, prefix: str = "") -> Iterator[tuple[str, dict]]:
    """(dotted path, table) for the config and each nested sub-config, depth first."""
    yield prefix, config
    for key, value in config.items():
        if isinstance(value, dict) and key not in _SKIPPED_TABLES:
            yield from tables(value, f"{prefix}{key}.")


def size_problems(config: dict) -> list[str]:
    """``"text_config.hidden_size = 64.5 (a fraction)"`` for each size-like field of every
    table that is not a usable size."""
    problems = []
    for prefix, table in tables(config):
        for key, value in table.items():
            if isinstance(key, str) and _size_like(key):
                why = _problem(key, value)
                if why == "zero" and key == "head_dim" and "qk_head_dim" in table:
                    continue  # latent-attention models size their heads by qk_/v_head_dim
                if why:
                    problems.append(f"{prefix}{key} = {_shown(value)} ({why})")
    return problems


def relation_problems(built: dict, given: dict) -> list[str]:
    """Widths that do not divide among heads, heads that do not divide among key/value heads,
    in each table of ``built`` (the parsed config, defaults filled in) that ``given`` (the
    user's config.json) sets; the head size counts as given only where ``given`` gives it."""
    given_tables = dict(tables(given))
    problems = []
    for prefix, table in tables(built):
        if prefix not in given_tables:  # transformers' own defaults: not the user's
            continue
        explicit = any(given_tables[prefix].get(k) is not None for k in _HEAD_SIZES)
        problems += _relations(prefix, table, explicit)
    return problems


def _relations(prefix: str, table: dict, explicit_head_size: bool) -> list[str]:
    sizes = {k: v for k, v in table.items() if type(v) is int and v > 0}
    width = next(((k, sizes[k]) for k in _WIDTHS if k in sizes), None)
    heads = [(k, sizes[k]) for k in _HEADS if k in sizes]
    problems = []
    if width and not explicit_head_size:
        problems += [f"{prefix}{width[0]} = {width[1]} is not a multiple of {prefix}{k} = {n}"
                     for k, n in heads if width[1] % n]
    query = next((h for h in heads if h[0] in ("num_attention_heads", "n_head")), None)
    for key in _KV_HEADS:
        if query and key in sizes and query[1] % sizes[key]:
            problems.append(f"{prefix}{query[0]} = {query[1]} is not a multiple of "
                            f"{prefix}{key} = {sizes[key]}")
    return problems


def _size_like(key: str) -> bool:
    if key in CORE:
        return True
    return key.endswith(_SIZE_ENDINGS) and not any(w in key for w in _NOT_SIZES)


def _problem(key: str, value) -> str | None:
    if value is None or isinstance(value, dict):
        return None  # transformers' default; a table of sizes is checked as a table
    if isinstance(value, list):
        return next((f"holds {_shown(v)}" for v in _flat(value)
                     if isinstance(v, (bool, float)) or isinstance(v, str) and v.isdigit()),
                    None)
    if isinstance(value, bool):
        return "a bool, not a size" if key in CORE or key.endswith(_NEVER_FLAGS) else None
    if isinstance(value, float) and (not value.is_integer() or key in CORE):
        return "a fraction" if not value.is_integer() else "a float, not an integer"
    if isinstance(value, float):
        value = int(value)  # 1200.0 positions: transformers' own defaults write some so
    if not isinstance(value, int):
        return f"a {type(value).__name__}, not an integer"
    if value < 0 and (key in CORE or value < -1):  # -1 means "none" in several configs
        return "negative"
    if value == 0 and key in CORE:
        return "zero"
    return None


def _flat(values: list) -> Iterator:
    for value in values:
        if isinstance(value, list):
            yield from _flat(value)
        else:
            yield value


def _shown(value) -> str:
    text = repr(value) if not isinstance(value, bool) else str(value).lower()
    return text if len(text) <= 40 else text[:37] + "..."
