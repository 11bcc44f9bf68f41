"""Rotary embeddings whose angles change with the sequence length (transformers'
``dynamic_rope_update``), made to fit a static cache or refused.

- ``dynamic`` (NTK) recomputes its frequencies once a call reaches past the model's
  positions, a branch on a tensor that torch.export cannot capture. ``--max-context`` is
  never over those positions (``LanguageModel.context_bounds``), so inside an artifact the
  branch never fires: the capture runs the rotary as the default rope it then is.
- ``longrope`` (Phi-3) takes its long factors once a call's sequence passes the original
  context, for every position of that call: the same token's keys then depend on how the
  prompt was cut into calls, and transformers' Phi-3 even computes the whole cache again
  with them (Phi3ForCausalLM.prepare_inputs_for_generation). Steps over a static cache
  can do neither, so a context past that point is refused.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from exporter.errors import SpecError


def _rope_types(module: torch.nn.Module) -> list[str]:
    rope_type = getattr(module, "rope_type", None)
    types = rope_type.values() if isinstance(rope_type, dict) else [rope_type]
    return [t for t in types if isinstance(t, str)]


def longrope_switch(model: torch.nn.Module) -> int | None:
    """The sequence length past which a longrope model takes its long factors, or None.
    The rope settings may be per layer type (Gemma 3's ``rope_parameters``: one dict for
    full, one for sliding layers): the smallest switch of any longrope among them."""
    if not any("longrope" in _rope_types(m) for m in model.modules()):
        return None
    config = model.config
    parameters = getattr(config, "rope_parameters", None) or {}
    nested = [p for p in parameters.values() if isinstance(p, dict)]
    switches = [getattr(config, "original_max_position_embeddings", None),
                parameters.get("original_max_position_embeddings"),
                *(p.get("original_max_position_embeddings") for p in nested
                  if p.get("rope_type", p.get("type")) == "longrope")]
    return min((s for s in switches if isinstance(s, int)), default=None)


def check_rope(model: torch.nn.Module, context: int, source: str) -> None:
    """Refuse a context that would cross a longrope model's switch to its long factors."""
    switch = longrope_switch(model)
    if switch and context > switch:
        raise SpecError(f"--max-context {context} is past this model's original context of "
                        f"{switch} positions, where its longrope switches to its long "
                        "factors for a whole call (in transformers, the keys of a token "
                        "past that point depend on how the prompt was cut into calls; "
                        "Phi-3 computes its whole cache again): steps over a static cache "
                        "cannot follow that", where=source,
                        hint=f"give --max-context {switch} or less")


@contextlib.contextmanager
def static_rope(model: torch.nn.Module) -> Iterator[None]:
    """While capturing: every ``dynamic`` rotary runs as the default rope, which it is up to
    the model's positions (its inverse frequencies are the original ones until then)."""
    changed = []
    for module in model.modules():
        rope_type = getattr(module, "rope_type", None)
        if not any("dynamic" in t for t in _rope_types(module)):
            continue
        changed.append((module, rope_type))
        module.rope_type = ({k: ("default" if "dynamic" in v else v) for k, v in rope_type.items()}
                            if isinstance(rope_type, dict) else "default")
    try:
        yield
    finally:
        for module, rope_type in changed:
            module.rope_type = rope_type
