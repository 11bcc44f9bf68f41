"""An encoder-decoder (Whisper, BART, Marian, ...) as pure functions for torch.export: one
``encode`` that returns the cross-attention keys/values of every decoder layer, and the
decoder's ``prefill``/``decode`` steps over the self-attention KV cache (as a causal LM's,
exporter/lm/wrapper.py) and that precomputed cross-attention cache.

    encode(source)                                  -> cross_k_0, cross_v_0, ...
    step(input_ids, positions, past_*, cross_*[, source_mask]) -> logits, k_0, v_0, ...

The cross keys/values are computed once per source, as ExecuTorch's and ONNX Runtime
GenAI's Whisper exports do, so a decode step reads them and never re-projects the encoder
states. ``encode`` gets them the model's own way: it runs the decoder once over one token
with a cache that records what each cross-attention layer projects (the rest of that
decoder call is unused and leaves the graph). The steps hand them back through
transformers' ``EncoderDecoderCache`` with every layer marked as already computed, the path
``generate`` itself takes after its first step.

The runtime keeps the cross cache in fixed buffers of ``Source.bound`` rows; a text source
shorter than that fills the first rows and ``source_mask`` (1 where a row holds a source
token) hides the rest. A speech encoder's length is fixed by the model (Whisper: 1500
frames after its convolutions), so its steps take no mask.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from exporter.lm.attention import attending_in_place
from exporter.lm.wrapper import ChunkCache, ChunkLayer, attention_mask, cache_keyword
from runtime.generation.layout import CacheLayer, CacheLayout

MAX_SOURCE_UNBOUNDED = 8192  # an encoder without a positions limit (T5)
MAX_SOURCE_DEFAULT = 1024  # a text encoder's longest source (the cross cache's rows)


@dataclass(frozen=True)
class Source:
    """What ``encode`` takes: ``input_ids`` [1, 1..bound] (text) or ``input_features``
    [1, *shape] (speech, a fixed length)."""
    input: str  # "input_ids" or "input_features"
    shape: tuple[int, ...]  # features: (mel bins, frames); ids: (bound,)
    bound: int  # rows of the cross cache (encoder positions)
    audio: dict | None = None  # Whisper's log-mel parameters (runtime/generation/audio.py)
    vocab: int | None = None  # a text encoder's own vocabulary (Marian's may differ)

    @property
    def masked(self) -> bool:
        return self.input == "input_ids"

    def to_json(self) -> dict:
        raw = {"input": self.input, "shape": list(self.shape), "bound": self.bound}
        if self.vocab is not None:
            raw["vocab"] = self.vocab
        return {**raw, "audio": self.audio} if self.audio else raw


def source_of(model: torch.nn.Module, max_source: int | None,
              folder: Path | None = None) -> Source:
    """The encoder's input and how long its output is, from the model itself; a text
    encoder's bound is ``max_source`` (None: its positions, at most MAX_SOURCE_DEFAULT).
    ``folder``: the checkpoint's, whose preprocessor_config.json gives Whisper's audio
    parameters."""
    config, encoder = model.config, model.get_encoder()
    if model.main_input_name == "input_features":
        positions = getattr(encoder, "max_source_positions", None)
        convs = [m for m in encoder.children() if isinstance(m, torch.nn.Conv1d)]
        if positions is None or not convs:
            raise NotImplementedError(f"{type(model).__name__}'s speech encoder has no fixed "
                                      "length this export knows (Whisper's convolutions)")
        stride = 1
        for conv in convs:
            stride *= conv.stride[0]
        if max_source is not None:
            raise ValueError("--max-source applies to text encoders; a speech encoder's "
                             f"length is fixed ({positions} positions)")
        return Source("input_features", (config.num_mel_bins, positions * stride), positions,
                      _audio(config, folder))
    if model.main_input_name != "input_ids":
        raise NotImplementedError(f"an encoder taking {model.main_input_name} has no export")
    positions = getattr(config, "max_position_embeddings", None)  # T5's are relative: none
    if max_source is not None and positions is not None and max_source > positions:
        raise ValueError(f"--max-source {max_source} is over the encoder's {positions} "
                         "positions")
    if max_source is not None and positions is None and max_source > MAX_SOURCE_UNBOUNDED:
        # T5's relative positions set no limit, but its full attention over the source is
        # N x N per head: the validation's encode of 100,000 tokens asked for 80 GB
        raise ValueError(f"--max-source {max_source} is over {MAX_SOURCE_UNBOUNDED}, the most "
                         "this export takes for an encoder without a positions limit (its "
                         "attention over the source grows with the square of its length)")
    bound = max_source or min(positions or MAX_SOURCE_DEFAULT, MAX_SOURCE_DEFAULT)
    return Source("input_ids", (bound,), bound, vocab=source_vocab(model))


_AUDIO_DEFAULTS = {"sampling_rate": 16000, "n_fft": 400, "hop_length": 160}


def _audio(config: Any, folder: Path | None) -> dict | None:
    """Whisper's feature extractor settings (its preprocessor_config.json, else
    WhisperFeatureExtractor's defaults): what the runtime needs to turn audio into the
    encoder's frames. None for other speech models (their front ends differ)."""
    if getattr(config, "model_type", None) != "whisper":
        return None
    audio = dict(_AUDIO_DEFAULTS, max_frequency=8000.0)
    path = folder / "preprocessor_config.json" if folder else None
    if path is not None and path.is_file():
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path} cannot be read ({exc})") from None
        if not isinstance(saved, dict):
            raise ValueError(f"{path} is not a JSON object")
        audio.update({k: saved[k] for k in _AUDIO_DEFAULTS if isinstance(saved.get(k), int)})
    return audio


def _encoder_width(config: Any) -> int:
    """The encoder's output width: BART's d_model, or hidden_size, on the model's config or
    its encoder's (T5Gemma keeps one config per side)."""
    for part in (getattr(config, "encoder", None), config):
        width = getattr(part, "d_model", None) or getattr(part, "hidden_size", None)
        if isinstance(width, int):
            return width
    raise NotImplementedError(f"{type(config).__name__} names no hidden size this export knows "
                              "(d_model, hidden_size)")


class _CrossLayer(CacheLayerMixin):
    """One decoder layer's cross-attention keys/values: given (a step), or recorded as the
    model projects them (``encode``)."""

    is_compileable = True

    def __init__(self, keys: torch.Tensor | None = None,
                 values: torch.Tensor | None = None) -> None:
        super().__init__()
        self.keys, self.values = keys, values
        self.is_initialized = keys is not None
        self.new: tuple[torch.Tensor, torch.Tensor] | None = None

    def lazy_initialization(self, key_states, value_states) -> None:
        return None

    def update(self, key_states, value_states, *args, **kwargs):
        self.new = (key_states, value_states)
        return key_states, value_states

    def get_seq_length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length(), 0

    def get_max_length(self) -> int:
        return -1


class _CrossCache(Cache):
    def __init__(self, layers: list[_CrossLayer]) -> None:
        super().__init__(layers=layers)


def _caches(self_layers: list, cross_layers: list, start, computed: bool
            ) -> EncoderDecoderCache:
    cache = EncoderDecoderCache(ChunkCache(self_layers, start), _CrossCache(cross_layers))
    cache.is_updated = {i: computed for i in range(len(cross_layers))}
    return cache


def _encoder_states(model: torch.nn.Module, source: Source, value: torch.Tensor):
    # a text source is all tokens (no padding): said as a mask, which LongT5's blocks need
    mask = {"attention_mask": torch.ones_like(value)} if source.masked else {}
    return model.get_encoder()(**{source.input: value}, **mask).last_hidden_state


def _decoder_call(model: torch.nn.Module, ids: torch.Tensor, positions: torch.Tensor,
                  encoder_states: torch.Tensor, cache: EncoderDecoderCache, **extra):
    """The whole model's forward from given encoder states: its head (BART's logits bias,
    T5's rescaling) applies as in ``generate``."""
    if "decoder_position_ids" in inspect.signature(model.forward).parameters:
        extra["decoder_position_ids"] = positions[None]
    return model(encoder_outputs=BaseModelOutput(last_hidden_state=encoder_states),
                 decoder_input_ids=ids, use_cache=True, **{cache_keyword(model): cache},
                 **extra)


def probe_seq2seq_layout(model: torch.nn.Module, source: Source, max_context: int,
                         dtype: torch.dtype) -> CacheLayout:
    """Encode an example and run two decoder tokens with recording caches: each layer's
    self and cross key/value heads and head dims, as the model computes them."""
    if getattr(model.config, "sliding_window", None):
        raise NotImplementedError("sliding-window decoder layers of an encoder-decoder")
    windows = [None] * _decoder_layer_count(model)
    device = next(model.parameters()).device
    with torch.no_grad():
        value = example_source(model, source, 4, device)
        if value.is_floating_point():  # speech features, in the model's dtype (fp16 builds)
            value = value.to(dtype)
        states = _encoder_states(model, source, value)
        self_layers = [ChunkLayer(None, None, w is not None) for w in windows]
        cross_layers = [_CrossLayer() for _ in windows]
        ids = torch.zeros(1, 2, dtype=torch.long, device=device)
        _decoder_call(model, ids, torch.arange(2, device=device), states,
                      _caches(self_layers, cross_layers, 0, computed=False))
    if any(layer.new is None for layer in self_layers + cross_layers):
        raise NotImplementedError("some decoder layers never wrote to the KV cache")
    return CacheLayout(batch=1, dtype=str(dtype).removeprefix("torch."),
                       layers=tuple(_shape_of(layer.new, w or max_context, w)
                                    for layer, w in zip(self_layers, windows)),
                       cross=tuple(_shape_of(layer.new, source.bound, None)
                                   for layer in cross_layers))


def _decoder_layer_count(model: torch.nn.Module) -> int:
    """From the modules, not the config: configs name the count differently (Whisper's
    ``decoder_layers``), and BART's ``get_text_config(decoder=True)`` is a default one."""
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None) or getattr(decoder, "block", None)
    if layers is None:
        raise NotImplementedError(f"{type(decoder).__name__} has no list of layers")
    return len(layers)


def _shape_of(new: tuple[torch.Tensor, torch.Tensor], slots: int,
              window: int | None) -> CacheLayer:
    k, v = new
    return CacheLayer(slots=slots, window=window, key_shape=(k.shape[1], k.shape[3]),
                      value_shape=(v.shape[1], v.shape[3]))


def example_source(model: torch.nn.Module, source: Source, length: int,
                   device: torch.device | str = "cpu", seed: int = 0) -> torch.Tensor:
    """A source for capture and probing: ``length`` random token ids, or random features
    (speech: the fixed shape; ``length`` does not apply)."""
    generator = torch.Generator().manual_seed(seed)
    if source.input == "input_features":
        return torch.randn(1, *source.shape, generator=generator).to(device)
    vocab = source_vocab(model)
    return torch.randint(0, vocab, (1, length), generator=generator).to(device)


def source_vocab(model: torch.nn.Module) -> int:
    encoder = model.get_encoder()
    try:
        return encoder.get_input_embeddings().weight.shape[0]
    except (AttributeError, NotImplementedError):  # FSMT's encoder has only the attribute
        return encoder.embed_tokens.weight.shape[0]


class ExportableEncoder(torch.nn.Module):
    """``encode``: the source -> every decoder layer's cross-attention keys and values."""

    user_model_attribute = "model"  # exporter/model/capture.py: module paths as the user's

    def __init__(self, model: torch.nn.Module, layout: CacheLayout, source: Source) -> None:
        super().__init__()
        self.model, self.layout, self.source = model, layout, source

    def forward(self, source: torch.Tensor) -> dict[str, torch.Tensor]:
        self_layers = [ChunkLayer(None, None, False) for _ in self.layout.layers]
        cross_layers = [_CrossLayer() for _ in self.layout.cross]
        zero = torch.zeros(1, dtype=torch.long, device=source.device)
        # with no cache layers given, attending_in_place only serves the bidirectional
        # calls without transformers' ``q_length > 1`` test, which under torch.export
        # pinned a text source's length to 2 or more (a one-token source was refused)
        with attending_in_place(self.model, [], zero[0]):
            states = _encoder_states(self.model, self.source, source)
            _decoder_call(self.model, zero[None], zero, states,
                          _caches(self_layers, cross_layers, 0, computed=False))
        result = {}
        for i, layer in enumerate(cross_layers):
            result[f"k_{i}"], result[f"v_{i}"] = layer.new
        return result


class ExportableSeq2SeqStep(torch.nn.Module):
    """``prefill``/``decode`` of the decoder (the contract: this module's docstring)."""

    user_model_attribute = "model"  # exporter/model/capture.py: module paths as the user's

    def __init__(self, model: torch.nn.Module, layout: CacheLayout, source: Source,
                 attention: str = "grouped") -> None:
        super().__init__()
        self.model, self.layout, self.source = model, layout, source
        self.attention = attention
        self._width = _encoder_width(model.config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                past: dict[str, torch.Tensor], cross: dict[str, torch.Tensor],
                source_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        layers = []
        for i, spec in enumerate(self.layout.layers):
            layer = ChunkLayer(past[f"k_{i}"], past[f"v_{i}"], spec.window is not None)
            layer.cross_keys = cross[f"k_{i}"]  # attention.py: not this layer's self keys
            layers.append(layer)
        cross_layers = [_CrossLayer(cross[f"k_{i}"], cross[f"v_{i}"])
                        for i in range(len(self.layout.cross))]
        dtype = past["k_0"].dtype
        mask = attention_mask(positions, self.layout.layers[0].slots, None, dtype)
        # the decoder takes the cross path only when handed encoder states; the cache
        # supplies the keys, so these zeros (never read) only carry the source's length
        states = torch.zeros((), dtype=dtype, device=input_ids.device).expand(
            1, self.source.bound, self._width)
        extra = {"attention_mask": source_mask} if source_mask is not None else {}
        cache = _caches(layers, cross_layers, positions[0], computed=True)
        with attending_in_place(self.model, layers, positions[0], self.attention):
            out = _decoder_call(self.model, input_ids, positions, states, cache,
                                decoder_attention_mask=mask, **extra)
        result = {"logits": out.logits}
        for i, layer in enumerate(layers):
            result[f"k_{i}"], result[f"v_{i}"] = layer.new
        return result
