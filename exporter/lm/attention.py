"""Attention over the KV cache as the exported step runs it: grouped-query heads without
repeating the key/value heads, and past slots and new rows without concatenating them.

transformers' own attention (eager or SDPA) is handed ``cat(past slots, new keys)`` with
the key/value heads repeated to the query heads' count. In a decode step that is most of
the work that is not a matrix-vector product (a copy of every layer's keys and values per
query head, and a concatenation, each step; docs/design-notes.md). Here each group of
query heads meets its one key/value head by a reshape, and the scores of the past slots
and of the new rows are computed apart and joined (a [heads, T, slots + T] tensor,
small), so the cache is read once, in place, by every target (the math:
runtime/generation/attention_op.py).

Each target says which attention its steps get (``Target.generation.step_attention``):
- "grouped", the above (cpu, tvm);
- "fused": the full-attention layers as one op, ``edge_exporter::cached_attention``, that
  the target lowers to a fused kernel (onnx: ONNX Runtime's GroupQueryAttention, which
  took the 300M int4 decode step from ~48 to ~35 ONNX nodes a layer); sliding-window
  layers (a ring, not slot = position) keep the grouped math;
- "sdpa": one ``scaled_dot_product_attention`` call over concat(past, new) and the step's
  mask, the query heads grouped onto their key/value head by SDPA's ``enable_gqa`` (cuda:
  its GPU kernels; cuBLAS runs the grouped matmuls as slower batched GEMMs, and
  transformers' SDPA repeats the key/value heads under torch.export). Calls it cannot
  take (softcap, a position bias, unknown keywords) run the model's own attention, T5's
  bias corrected by this module.

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
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from runtime.generation.attention_op import cached_attention as cached_attention_op
from runtime.generation.attention_op import grouped_attention

log = logging.getLogger(__name__)

ATTENTION_NAME = "edge_exporter_cached"
# keywords transformers passes that this function honours or that do not change the result
_UNDERSTOOD = {"scaling", "dropout", "softcap", "sliding_window", "position_ids",
               "cache_position", "output_attentions", "use_cache", "is_causal"}



@dataclass(frozen=True)
class _Step:
    """What the attention of one traced step needs besides its arguments."""
    layers: list  # the ChunkLayer of each decoder layer
    fallback: Callable  # the model's own attention (calls this module cannot take)
    start: torch.Tensor  # the first new token's position (0-d)
    attention: str  # the target's step_attention: "grouped", "fused" or "sdpa"


_ACTIVE: contextvars.ContextVar[_Step | None] = contextvars.ContextVar("_ACTIVE", default=None)


@contextlib.contextmanager
def attending_in_place(model: torch.nn.Module, layers: list, start: torch.Tensor,
                       attention: str = "grouped") -> Iterator[None]:
    """While the block runs, ``model`` attends through this module, over ``layers`` (the
    ``ChunkLayer`` of each decoder layer); then it has its own implementation back,
    which also serves the calls this function cannot take. ``attention``: the target's
    ``step_attention`` (this module's docstring)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    before = model.config._attn_implementation
    fallback = (ALL_ATTENTION_FUNCTIONS[before] if before in ALL_ATTENTION_FUNCTIONS
                else _eager(model))
    if fallback is None:  # BLOOM's attention is written inline
        yield
        return
    _register()
    # (model, its implementation before), all read first: switching the outer model may
    # switch the inner ones too
    owners = [(owner, owner.config._attn_implementation) for owner in _config_owners(model)]
    switched = []
    for owner, own in owners:
        try:
            owner.set_attn_implementation(ATTENTION_NAME)
            switched.append((owner, own))
        except ValueError as exc:  # a model class that takes no registered attention
            log.debug("%s keeps its own attention: %s", type(owner).__name__, exc)
            if owner is model:  # the model itself: it attends as it always did
                yield
                return
    token = _ACTIVE.set(_Step(layers, fallback, start, attention))
    try:
        yield
    finally:
        _restore(switched)
        _ACTIVE.reset(token)


def _config_owners(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model and each sub-model with a config of its own, outermost first. T5 gives
    its encoder and decoder stacks copies of its config; transformers 5.17 sets the
    attention on the outer config only, so T5's layers kept SDPA, without this module's
    position-bias correction (its builds failed the exact gate); 5.24 sets the copies
    too."""
    from transformers import PreTrainedModel
    owners, configs = [], set()
    for module in model.modules():
        if isinstance(module, PreTrainedModel) and id(module.config) not in configs:
            configs.add(id(module.config))
            owners.append(module)
    return owners


def _restore(switched: list[tuple[torch.nn.Module, str]]) -> None:
    for owner, before in switched:  # outermost first: it may reset the inner ones too
        owner.set_attn_implementation(before)


def cached_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                     value: torch.Tensor, attention_mask: torch.Tensor | None, **kwargs
                     ) -> tuple[torch.Tensor, None]:
    """``query`` [B, H, T, D]; the layer's past [B, KVH, S, D] and new rows [B, KVH, T, D]
    come from ``attending_in_place`` (``key``/``value``, their concatenation, go unused and
    drop out of the exported graph). Returns [B, T, H, Dv] as transformers expects."""
    active = _ACTIVE.get()
    layer = _layer_of(active.layers, module, key, value)
    scaling, softcap = kwargs.get("scaling"), kwargs.get("softcap")
    bias = kwargs.get("position_bias")  # T5's relative position bias, per head
    if layer is not None and bias is not None and bias.shape[-1] == key.shape[-2]:
        bias = _bias_over_slots(bias, layer.past[0].shape[-2], active.start, query.shape[2])
        kwargs = {**kwargs, "position_bias": bias}
    elif bias is not None:
        layer = None  # a bias this module cannot place: the model's own, as it is
    plain = (layer is not None and scaling is not None and not kwargs.get("dropout")
             and not set(kwargs) - _UNDERSTOOD - {"position_bias"})
    if active.attention == "sdpa" and plain and bias is None and not kwargs.get("softcap") \
            and attention_mask is not None:  # the step's mask is all the masking there is
        return _sdpa(query, key, value, attention_mask, scaling, grouped=True), None
    if active.attention == "sdpa" or not plain:
        if _bidirectional_sdpa(active, module, scaling, kwargs):
            return _sdpa(query, key, value, attention_mask, scaling, bias), None
        return active.fallback(module, query, key, value, attention_mask, **kwargs)
    (past_k, past_v), (new_k, new_v) = layer.past, layer.new
    if bias is not None:  # one more additive mask
        attention_mask = bias if attention_mask is None else attention_mask + bias
    elif active.attention == "fused" and _fusable(layer, query):
        return cached_attention_op(query, new_k, new_v, past_k, past_v, active.start,
                                   float(scaling), float(softcap or 0.0)), None
    return grouped_attention(query, past_k, past_v, new_k, new_v, attention_mask, scaling,
                             softcap), None


def _bidirectional_sdpa(active: _Step, module: torch.nn.Module, scaling, kwargs: dict) -> bool:
    """A call transformers' SDPA would serve without a causal mask (a cross-attention):
    ``_sdpa`` serves it the same. transformers' own tests ``q_length > 1`` first, which
    under torch.export pins a dynamic length to 2 or more: one prefill program could not
    decode (exporter/lm/build.py, decode_on_prefill), an encoder not take one token."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return (active.fallback is sdpa_attention_forward and scaling is not None
            and not getattr(module, "is_causal", True) and not kwargs.get("dropout")
            and not kwargs.get("is_causal") and not set(kwargs) - _UNDERSTOOD - {"position_bias"})


def _sdpa(query, key, value, mask, scaling, bias=None, grouped: bool = False
          ) -> torch.Tensor:
    """``query`` [B, H, T, D], key/value [B, KVH, S, D] -> [B, T, H, Dv], where ``mask``
    (if any) is all the masking: transformers' SDPA without its length test, joining
    ``bias`` (T5's position bias) to the mask with transformers' own helper. ``grouped``:
    the query heads meet their key/value head through SDPA's ``enable_gqa`` (GPU kernels
    take it; the ONNX exporter and the CPU targets get the heads repeated)."""
    from transformers.integrations.sdpa_attention import create_position_bias_mask, repeat_kv
    if not grouped:
        groups = query.shape[1] // key.shape[1]
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    if mask is not None:
        mask = mask[:, :, :, :key.shape[-2]]
    if bias is not None:
        mask = create_position_bias_mask(bias, mask, False, query, key)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling,
        enable_gqa=grouped and query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous()


def _bias_over_slots(bias: torch.Tensor, slots: int, start: torch.Tensor,
                     length: int) -> torch.Tensor:
    """T5 computes its relative position bias [1, H, T, K] for keys at positions 0..K-1,
    K = slots + T, the length of what the cache hands it. A full layer's slot s does hold
    position s, but the T new keys sit at columns slots.. while their positions are
    start..: their bias is the columns of those positions (start + T <= slots)."""
    new = start + torch.arange(length, device=bias.device)
    return torch.cat([bias[..., :slots], bias.index_select(-1, new)], dim=-1)


def _fusable(layer, query: torch.Tensor) -> bool:
    """A full-attention layer (slot = position, as the op assumes; a ring is not) of one
    sequence whose query, key and value heads share one size that is a multiple of 8:
    what ONNX Runtime's GroupQueryAttention, the one fused kernel, takes (a GPT-2 of
    heads of 12 failed on load: "head_size must be a multiple of 8")."""
    new_k, new_v = layer.new
    return (not layer.is_sliding and query.shape[0] == 1
            and query.shape[-1] == new_k.shape[-1] == new_v.shape[-1]
            and query.shape[-1] % 8 == 0 and query.shape[1] % new_k.shape[1] == 0)


def _layer_of(layers: list, module: torch.nn.Module, key: torch.Tensor,
              value: torch.Tensor):
    """The ChunkLayer whose rows this call attends with, or None: the model's own attention
    then runs over the ``key``/``value`` it was handed."""
    index = getattr(module, "layer_idx", None)
    if index is None or not 0 <= index < len(layers):
        return None
    layer = layers[index]
    if layer.cross_keys is not None and key is layer.cross_keys:
        return None  # an encoder-decoder's cross-attention (its self-attention's layer_idx)
    # the call must attend with the very rows the cache handed out: multi-head latent
    # attention (DeepSeek-V3) caches compressed latents and expands them after reading
    # the cache; differential attention (DiffLlama) splits and repeats the values (of the
    # cache's shape: a shape check let its steps compute with the wrong values)
    if layer.handed is None or key is not layer.handed[0] or value is not layer.handed[1]:
        # a layer that reuses an earlier one's keys and values (Gemma 3n): that layer's
        return next((other for other in layers if other.handed is not None
                     and key is other.handed[0] and value is other.handed[1]), None)
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
