"""The KV cache of a generating artifact: its layout, as the build fixed it.

A generating artifact's two entry points (``prefill``, ``decode``) are pure functions:

    (input_ids[1, T], positions[T], past_k_0, past_v_0, ...) -> (logits[1, T, V], k_0, v_0, ...)

``past_*`` are the cache's current contents and ``k_i``/``v_i`` the keys and values of the
T new tokens. The runtime owns one preallocated buffer per ``past_*`` input (``KvCache``)
and writes the new entries into it after each step, so the cache is allocated once and
never copied. (A step whose kernel stores its rows in the buffer itself returns them as
views of their slots, or to the generator not at all (``Program.run_in_place``), and the
write leaves them: targets/onnx/stored_rows.py, targets/aoti/passes/attention_store.py.)
A layer's buffer has ``slots`` rows: slot ``s`` holds the newest position ``q < start``
with ``q % slots == s``. A full-attention layer has ``slots == max_context`` (positions
map to themselves); a sliding-window layer keeps only its window
as a ring (``slots == window``), so a 4,096-token window costs 4,096 rows whatever the
context, and no key inside the window is ever dropped. The graph masks slots by the
position they hold, so the runtime never clears anything between prompts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

INPUT_IDS, POSITIONS, LOGITS = "input_ids", "positions", "logits"  # the steps' names
# a decode step may also return its greedy next token: the argmax of its last row of
# logits, int64 [1] (the first of equal maxima), which the decode graph feeds back
NEXT_TOKEN = "next_token"
PAST_PREFIX = "past_"  # entry-point inputs past_k_0, past_v_0, ...; outputs k_0, v_0, ...
# an encoder-decoder's steps also read cross_k_0, cross_v_0, ... (what ``encode`` returned
# as k_0, v_0, ...): one buffer a decoder layer, written once per source, never by a step
CROSS_PREFIX = "cross_"


@dataclass(frozen=True)
class CacheLayer:
    slots: int  # rows of this layer's buffers
    window: int | None  # sliding window (keys with position > query - window); None: full
    key_shape: tuple[int, int]  # (kv heads, key head dim)
    value_shape: tuple[int, int]  # (kv heads, value head dim)
    # the model's decoder layer that writes it, where that is not its own index: layers
    # that reuse an earlier layer's keys and values (Gemma 3n) have no buffers of their own
    layer: int | None = None

    def to_json(self) -> dict:
        raw = {"slots": self.slots, "window": self.window, "key_shape": list(self.key_shape),
               "value_shape": list(self.value_shape)}
        return raw if self.layer is None else {**raw, "layer": self.layer}

    @classmethod
    def from_json(cls, raw: Any) -> "CacheLayer":
        window, layer = raw.get("window"), raw.get("layer")
        return cls(slots=_positive(raw["slots"], "slots"),
                   window=None if window is None else _positive(window, "window"),
                   key_shape=_shape(raw["key_shape"], "key_shape"),
                   value_shape=_shape(raw["value_shape"], "value_shape"),
                   layer=None if layer is None else _index(layer))


@dataclass(frozen=True)
class CacheLayout:
    batch: int
    dtype: str  # torch/numpy dtype name of the buffers, e.g. "float16"
    layers: tuple[CacheLayer, ...]
    cross: tuple[CacheLayer, ...] = ()  # an encoder-decoder's cross-attention buffers

    def names(self) -> list[tuple[str, str]]:
        """(input name, output name) per buffer, in the entry points' order."""
        pairs = []
        for index in range(len(self.layers)):
            pairs += [(f"{PAST_PREFIX}k_{index}", f"k_{index}"),
                      (f"{PAST_PREFIX}v_{index}", f"v_{index}")]
        return pairs

    def shapes(self) -> list[tuple[int, ...]]:
        """Each buffer's shape, in ``names()`` order: (batch, heads, slots, head dim)."""
        return self._shapes(self.layers)

    def cross_names(self) -> list[tuple[str, str]]:
        """(the steps' input name, ``encode``'s output name) per cross-attention buffer."""
        return [(f"{CROSS_PREFIX}{new}", new) for _, new in self.names()[:2 * len(self.cross)]]

    def cross_shapes(self) -> list[tuple[int, ...]]:
        return self._shapes(self.cross)

    def _shapes(self, layers: tuple[CacheLayer, ...]) -> list[tuple[int, ...]]:
        shapes = []
        for layer in layers:
            for heads, dim in (layer.key_shape, layer.value_shape):
                shapes.append((self.batch, heads, layer.slots, dim))
        return shapes

    def nbytes(self, itemsize: int) -> int:
        total = 0
        for shape in self.shapes() + self.cross_shapes():
            count = 1
            for size in shape:
                count *= size
            total += count * itemsize
        return total

    def to_json(self) -> dict:
        raw = {"batch": self.batch, "dtype": self.dtype,
               "layers": [layer.to_json() for layer in self.layers]}
        if self.cross:
            raw["cross"] = [layer.to_json() for layer in self.cross]
        return raw

    @classmethod
    def from_json(cls, raw: Any) -> "CacheLayout":
        layers = raw["layers"]
        if not isinstance(layers, list) or not layers:
            raise ValueError("the cache layout has no layers")
        if not isinstance(raw["dtype"], str):
            raise TypeError("the cache layout's dtype must be a string")
        return cls(batch=_positive(raw["batch"], "batch"), dtype=raw["dtype"],
                   layers=tuple(CacheLayer.from_json(layer) for layer in layers),
                   cross=tuple(CacheLayer.from_json(layer) for layer in raw.get("cross", [])))


def _index(value: Any) -> int:
    if type(value) is not int or not 0 <= value < 1 << 20:
        raise ValueError(f"the cache layout's layer must be a layer index, not {value!r:.40}")
    return value


def _positive(value: Any, what: str) -> int:
    if type(value) is not int or not 0 < value < 1 << 31:
        raise ValueError(f"the cache layout's {what} must be a positive integer, not {value!r:.40}")
    return value


def _shape(value: Any, what: str) -> tuple[int, int]:
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(f"the cache layout's {what} must be [heads, head_dim]")
    return (_positive(value[0], what), _positive(value[1], what))


def vocabulary(signature) -> int:
    """The vocabulary a step program of this signature scores: its logits' last dim."""
    return next(t for t in signature.outputs if t.name == LOGITS).shape[-1].size


def shortest_source(encode) -> int:
    """The fewest tokens an ``encode`` program of this signature takes, as its capture
    bounded them (exporter/lm/build.py captures a text encoder from one token)."""
    length = encode.inputs[0].shape[1]
    return (length.min or 1) if length.is_dynamic else length.size


def takes_one_token(signature) -> bool:
    """Whether a step program of this signature takes a single token (its input_ids'
    length, dim 1, is 1 or may be): a prefill that is the decode step too."""
    ids = next((spec for spec in signature.inputs if spec.name == INPUT_IDS), None)
    length = ids.shape[1] if ids is not None and len(ids.shape) == 2 else None
    return length is not None and (length.size == 1 or (length.is_dynamic
                                                         and (length.min or 0) <= 1))
