"""Attention over the KV cache as the exported step runs it: grouped-query heads without
repeating the key/value heads, and past slots and new rows without concatenating them.

transformers' own attention (eager or SDPA) is handed ``cat(past slots, new keys)`` with
the key/value heads repeated to the query heads' count. In a decode step that is most of
the work that is not a matrix-vector product: a 300M LLaMA's int4 ONNX decode step spent
2.2 ms in 40 Expand nodes (each a 1 MB copy of a layer's keys or values, four times
over) and 1.1 ms in 82 Concat nodes, against 7.5 ms in all its weight GEMVs (ORT's
profiler, 2 cores, bench/RESULTS.md). Here each group of query heads meets its one
key/value head by a reshape, and the scores of the past slots and of the new rows are
computed apart and joined (a [heads, T, slots + T] tensor, small), so the cache is read
once, in place, by every target.

Registered with transformers' ``AttentionInterface`` under ``ATTENTION_NAME``; while
``ExportableCausalLM`` runs it sets the layers of the call (``attending_in_place``). Where a
call is not one this function can take (no scaling given, an unknown keyword such as
attention sinks, a layer it was not told of), it runs the model's own implementation.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
from typing import Callable, Iterator

import torch

log = logging.getLogger(__name__)

ATTENTION_NAME = "edge_exporter_cached"
# keywords transformers passes that this function honours or that do not change the result
_UNDERSTOOD = {"scaling", "dropout", "softcap", "sliding_window", "position_ids",
               "cache_position", "output_attentions", "use_cache", "is_causal"}

# (the layers of the call, the model's own attention function) while a step is traced
_ACTIVE: contextvars.ContextVar[tuple[list, Callable] | None] = contextvars.ContextVar(
    "_ACTIVE", default=None)


@contextlib.contextmanager
def attending_in_place(model: torch.nn.Module, layers: list) -> Iterator[None]:
    """While the block runs, ``model`` attends through this module, over ``layers`` (the
    ``_ChunkLayer`` of each decoder layer); then it has its own implementation back,
    which also serves the calls this function cannot take."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    before = model.config._attn_implementation
    fallback = (ALL_ATTENTION_FUNCTIONS[before] if before in ALL_ATTENTION_FUNCTIONS
                else _eager(model))
    if fallback is None:  # attention written inline (BLOOM): the model's own, as it is
        yield
        return
    _register()
    try:
        model.set_attn_implementation(ATTENTION_NAME)
    except ValueError as exc:  # a model class that takes no registered attention
        log.debug("%s keeps its own attention: %s", type(model).__name__, exc)
        yield
        return
    token = _ACTIVE.set((layers, fallback))
    try:
        yield
    finally:
        model.set_attn_implementation(before)
        _ACTIVE.reset(token)


def cached_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                     value: torch.Tensor, attention_mask: torch.Tensor | None, **kwargs
                     ) -> tuple[torch.Tensor, None]:
    """``query`` [B, H, T, D]; the layer's past [B, KVH, S, D] and new rows [B, KVH, T, D]
    come from ``attending_in_place`` (``key``/``value``, their concatenation, go unused and
    drop out of the exported graph). Returns [B, T, H, Dv] as transformers expects."""
    layers, fallback = _ACTIVE.get()
    layer = _layer_of(layers, module, key)
    scaling, softcap = kwargs.get("scaling"), kwargs.get("softcap")
    if layer is None or scaling is None or kwargs.get("dropout") or set(kwargs) - _UNDERSTOOD:
        return fallback(module, query, key, value, attention_mask, **kwargs)
    (past_k, past_v), (new_k, new_v) = layer.past, layer.new
    batch, heads, length, _ = query.shape
    groups = heads // new_k.shape[1]
    # head h attends with key/value head h // groups (transformers' repeat_kv order)
    grouped = query.reshape(batch, new_k.shape[1], groups * length, query.shape[-1])
    scores = torch.cat([grouped @ past_k.transpose(-1, -2),
                        grouped @ new_k.transpose(-1, -2)], dim=-1) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    slots = past_k.shape[-2]
    shape = scores.shape
    if attention_mask is not None:  # [1 or B, 1, T, slots + T], the same for every head
        scores = (scores.view(batch, new_k.shape[1], groups, length, -1)
                  + attention_mask[:, :, None]).view(shape)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = probs[..., :slots] @ past_v + probs[..., slots:] @ new_v  # [B, KVH, G*T, Dv]
    out = out.reshape(batch, heads, length, out.shape[-1]).transpose(1, 2)
    return out, None


def _layer_of(layers: list, module: torch.nn.Module, key: torch.Tensor):
    index = getattr(module, "layer_idx", None)
    if index is None or not 0 <= index < len(layers):
        return None
    layer = layers[index]
    past, new = layer.past, layer.new
    if past[0] is None or new is None or key.shape[-2] != past[0].shape[-2] + new[0].shape[-2]:
        return None
    return layer


def _eager(model: torch.nn.Module) -> Callable | None:
    """The model's own eager attention function (defined in its modeling file), or None
    where its attention does not go through transformers' interface."""
    import importlib
    module = importlib.import_module(type(model).__module__)
    return getattr(module, "eager_attention_forward", None)


@functools.cache
def _register() -> None:
    """This function under ``ATTENTION_NAME``, once per process. The masks transformers
    builds for the name are SDPA's (boolean or additive 4D); the exported step passes its
    own 4D masks, which transformers hands through."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    AttentionInterface.register(ATTENTION_NAME, cached_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, sdpa_mask)
