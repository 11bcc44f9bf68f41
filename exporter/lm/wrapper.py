"""A Hugging Face causal LM as a pure function of its KV cache, ready for torch.export.

``ExportableCausalLM.forward(input_ids[1, T], positions[T], past)`` returns the logits of
the T tokens and their keys/values (runtime/generation/layout.py states the contract), and
a decode step built ``with_next_token`` its greedy next token too.
Nothing is mutated inside the graph: every target (AOTInductor, ONNX, the torch fallback)
gets the same plain graph, and the runtime writes the new rows into its one cache buffer.

Why our own cache rather than transformers' ``StaticCache``: its sliding-window layers keep
a Python-int length and branch on it (one graph per branch, truncation when a chunk
overflows the window), and its ``update`` mutates buffers, which ONNX cannot express. Here
each layer's attention sees ``cat(past slots, new keys)`` and a mask computed from the
positions the slots hold, so one graph serves every start position and chunk length.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from exporter.lm.attention import attending_in_place
from runtime.generation.layout import NEXT_TOKEN, CacheLayer, CacheLayout

FULL, SLIDING = "full_attention", "sliding_attention"


class ChunkLayer(CacheLayerMixin):
    """One layer's view for one call: its past slots, and the new keys it is handed."""

    is_compileable = True

    def __init__(self, past_k: torch.Tensor | None, past_v: torch.Tensor | None,
                 sliding: bool) -> None:
        super().__init__()
        self.past = (past_k, past_v)
        self.is_sliding = sliding
        self.new: tuple[torch.Tensor, torch.Tensor] | None = None
        self.handed: tuple[torch.Tensor, torch.Tensor] | None = None
        # an encoder-decoder's cross keys for this layer (exporter/lm/seq2seq.py): the
        # attention call that gets them is the cross-attention, not this layer's own
        self.cross_keys: torch.Tensor | None = None
        self.is_initialized = True
        self.start: torch.Tensor | int = 0  # set by ChunkCache: the call's first position

    def lazy_initialization(self, key_states, value_states) -> None:  # never lazy
        return None

    def update(self, key_states, value_states, *args, **kwargs):
        self.new = (key_states, value_states)
        past_k, past_v = self.past
        if past_k is None:  # the layout probe: no past
            return key_states, value_states
        # what the attention call must be handed for the in-place step to stand in for it
        # (exporter/lm/attention.py _layer_of)
        self.handed = (torch.cat([past_k, key_states], dim=-2),
                       torch.cat([past_v, value_states], dim=-2))
        return self.handed

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        # asked only by the layout probe (the entry points pass their own 4D masks)
        past = 0 if self.past[0] is None else self.past[0].shape[-2]
        return past + query_length, 0

    def get_seq_length(self):
        return self.start

    def get_max_length(self) -> int:
        return -1


class ChunkCache(Cache):
    """The cache of one call. Its length is the call's first position (a 0-dim tensor of
    the graph's input), the same for every layer: models that number positions
    themselves read it (BART's ``arange(T) + cache length``, Llama 4's attention
    temperature on its NoPE layers). A constant 0 here made Llama 4 scale every chunk
    after the first, and every decode step, as if it started the sequence: the tokens
    differed past ``floor_scale`` positions while validation passed."""

    def __init__(self, layers: list[ChunkLayer], start: torch.Tensor | int = 0) -> None:
        super().__init__(layers=layers)
        for layer in layers:
            layer.start = start


def layer_kinds(config: Any, max_context: int) -> list[int | None]:
    """Per decoder layer: its sliding window, or None for full attention. A window at
    least as long as the context is full attention (same keys, no ring needed)."""
    count = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None) or (
        [SLIDING if window else FULL] * count)
    unknown = sorted(set(types) - {FULL, SLIDING})
    if unknown:
        raise NotImplementedError(f"its {', '.join(unknown)} layers have no KV-cache export "
                                  "(a static cache of keys and values)")
    return [window if kind == SLIDING and window and window < max_context else None
            for kind in types[:count]]


def cache_keyword(model: torch.nn.Module) -> str:
    """transformers renamed ``past_key_values`` to ``cache`` (5.2x); take what this one has."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def probe_layout(model: torch.nn.Module, max_context: int, dtype: torch.dtype) -> CacheLayout:
    """Run two tokens through the model with a recording cache: each layer's key/value
    heads and head dims, as the model itself computes them (MQA, GQA, odd head dims)."""
    windows = layer_kinds(model.config, max_context)
    layers = [ChunkLayer(None, None, w is not None) for w in windows]
    device = next(model.parameters()).device
    ids = torch.zeros(1, 2, dtype=torch.long, device=device)
    with torch.no_grad():
        model(input_ids=ids, position_ids=torch.arange(2, device=device)[None],
              use_cache=True, **{cache_keyword(model): ChunkCache(layers)})
    written = [index for index, layer in enumerate(layers) if layer.new is not None]
    if not written:
        raise NotImplementedError("no layer wrote to the KV cache")
    # a layer that never wrote reuses an earlier one's keys and values (Gemma 3n's KV
    # sharing): it gets no buffers, and the writers' entries name their layer
    shared = len(written) < len(layers)
    shapes = []
    for index in written:
        k, v = layers[index].new
        window = windows[index]
        shapes.append(CacheLayer(slots=window or max_context, window=window,
                                 key_shape=(k.shape[1], k.shape[3]),
                                 value_shape=(v.shape[1], v.shape[3]),
                                 layer=index if shared else None))
    return CacheLayout(batch=1, dtype=str(dtype).removeprefix("torch."), layers=tuple(shapes))


def model_layers(layout: CacheLayout, count: int) -> list[int | None]:
    """Per decoder layer of the model: the index of its cache entry in ``layout``, or None
    for a layer that reuses another's keys and values."""
    owners = [spec.layer if spec.layer is not None else index
              for index, spec in enumerate(layout.layers)]
    return [owners.index(layer) if layer in owners else None for layer in range(count)]


class ExportableCausalLM(torch.nn.Module):
    user_model_attribute = "model"  # exporter/model/capture.py: module paths as the user's

    def __init__(self, model: torch.nn.Module, layout: CacheLayout,
                 attention: str = "grouped") -> None:
        """``attention``: the target's ``step_attention`` (exporter/lm/attention.py)."""
        super().__init__()
        self.model = model
        self.layout = layout
        self.attention = attention
        self._cache_keyword = cache_keyword(model)
        self._entries = model_layers(layout, model.config.num_hidden_layers)
        self.next_token = False  # with_next_token's step
        kinds = {layer.window is not None for layer in layout.layers}
        # models with both kinds take a dict of masks by layer type; others one tensor
        self._mixed = len(kinds) == 2

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                past: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``past`` is keyed k_0, v_0, ... (torch.export names the inputs past_k_0, ...)."""
        layers = [ChunkLayer(None, None, False) if entry is None else
                  ChunkLayer(past[f"k_{entry}"], past[f"v_{entry}"],
                             self.layout.layers[entry].window is not None)
                  for entry in self._entries]
        dtype = past["k_0"].dtype
        masks = {}
        for spec in self.layout.layers:
            kind = SLIDING if spec.window is not None else FULL
            if kind not in masks:
                masks[kind] = attention_mask(positions, spec.slots, spec.window, dtype)
        mask = masks if self._mixed else next(iter(masks.values()))
        with attending_in_place(self.model, layers, positions[0],  # attention.py: why
                                self.attention):
            out = self.model(input_ids=input_ids, position_ids=positions[None],
                             attention_mask=mask, use_cache=True,
                             **{self._cache_keyword: ChunkCache(layers, positions[0])})
        result = {"logits": out.logits}
        for layer, entry in zip(layers, self._entries):
            if entry is not None:
                result[f"k_{entry}"], result[f"v_{entry}"] = layer.new
        if self.next_token:  # the last row's argmax, as the runtime's greedy_tail takes it
            result[NEXT_TOKEN] = torch.argmax(out.logits[0, -1:], -1)
        return result

    def with_next_token(self) -> "ExportableCausalLM":
        """This step also returning its greedy next token (``NEXT_TOKEN``), the same
        module otherwise (its weights shared): a decode step whose target takes the
        token inside its head's kernel (targets/aoti/passes/decode_argmax.py)."""
        step = copy.copy(self)
        step.next_token = True
        return step


def attention_mask(positions: torch.Tensor, slots: int, window: int | None,
                   dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [1, 1, T, slots + T] for ``cat(past slots, new keys)``.

    Slot s holds the newest position q < start with q % slots == s (q < 0: empty), so a
    full layer (slots = context) has q = s for s < start, and a ring holds the window."""
    start = positions[0]
    slot = torch.arange(slots, device=positions.device)
    held = start - 1 - torch.remainder(start - 1 - slot, slots)  # position in each slot
    query = positions[:, None]
    past_ok = (held >= 0)[None, :].expand(positions.shape[0], slots)
    new_ok = positions[None, :] <= query
    if window is not None:
        past_ok = past_ok & (held[None, :] > query - window)
        new_ok = new_ok & (positions[None, :] > query - window)
    allowed = torch.cat([past_ok, new_ok], dim=1)
    zero = torch.zeros((), dtype=dtype, device=positions.device)
    blocked = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=positions.device)
    return torch.where(allowed, zero, blocked)[None, None]
