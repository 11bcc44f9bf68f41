"""``--dtype fp16|bf16`` means what ``model.to(dtype)`` means to the user.

The module is cast *before* capture, so the model's own dtype logic runs as it does in
eager: Hugging Face attention masks come from ``torch.finfo(dtype).min`` of the model's
dtype (a float32 minimum baked into an fp16 graph overflows), and deliberate float32
upcasts (RMSNorm's ``hidden.to(torch.float32)``) stay float32. Rewriting float32
literals in a captured graph, as this toolchain once did, broke both.

At the boundary the caller keeps its dtypes: float inputs are cast on entry, float
outputs go back to float32.

    before: model(x: f32) -> f32, weights f32
    after:  CastModel(x: f32) = model.to(f16)(x.to(f16)).to(f32)
"""

from __future__ import annotations

import inspect

import torch
from torch.utils._pytree import tree_map_only

from exporter.model.given_module import converted_copy

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class CastModel(torch.nn.Module):
    """A float32 model run at ``dtype``: a cast copy (the user's model is untouched)."""

    user_model_attribute = "model"  # exporter/model/capture.py: module paths as the user's

    def __init__(self, model: torch.nn.Module, dtype: str) -> None:
        super().__init__()
        if dtype not in DTYPES:
            raise ValueError(f"CastModel takes one of {sorted(DTYPES)}, not {dtype!r}")
        self.dtype = DTYPES[dtype]
        # a copy: Module.to() converts Parameters in place, and they are the user's
        self.model = converted_copy(model, dtype=self.dtype).eval()

    def forward(self, *args, **kwargs):
        def down(t: torch.Tensor) -> torch.Tensor:
            return t.to(self.dtype) if t.is_floating_point() else t

        def up(t: torch.Tensor) -> torch.Tensor:
            return t.float() if t.is_floating_point() else t

        args, kwargs = tree_map_only(torch.Tensor, down, (args, kwargs))
        return tree_map_only(torch.Tensor, up, self.model(*args, **kwargs))


def cast_model(model: torch.nn.Module, dtype: str) -> CastModel:
    """``CastModel`` whose ``forward`` shows the model's own signature, so torch.export
    binds dynamic shapes and names inputs by the model's parameter names."""
    def forward(self, *args, **kwargs):
        return CastModel.forward(self, *args, **kwargs)
    forward.__signature__ = inspect.signature(type(model).forward)
    cls = type(f"{type(model).__name__}At{dtype.upper()}", (CastModel,), {"forward": forward})
    return cls(model, dtype)


def cast_record(model: torch.nn.Module, dtype: str) -> dict:
    """The manifest's record of the cast, in the shape of a pass record."""
    before = _float_bytes(model)
    return {"name": "cast_dtype", "modified": True, "seconds": 0.0,
            "info": {"dtype": dtype, "float_weight_bytes_before": before,
                     "float_weight_bytes_after": before // 2, "when": "before capture "
                     "(model.to(dtype); inputs cast on entry, float outputs to float32)"}}


def _float_bytes(module: torch.nn.Module) -> int:
    tensors = {id(t): t for t in [*module.parameters(), *module.buffers()]}.values()
    return sum(t.numel() * t.element_size() for t in tensors if t.is_floating_point())
