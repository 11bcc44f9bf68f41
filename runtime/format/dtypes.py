"""The one table of tensor dtypes: the names a manifest writes (torch's, without "torch."),
which of them numpy holds, and the lookups both ways.

Torch-free on purpose: a device that runs only ONNX Runtime or TVM partitions has numpy
and no torch (runtime/program/requires.py), and still checks every manifest dtype against this.
Numpy's names for the shared dtypes are torch's ("float32", "bool", "complex64"), so one
name serves both libraries.
"""

from __future__ import annotations

from typing import Any

# Dtypes numpy holds too: arrays in and out on a device without torch.
NUMPY_TWINS = frozenset({
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128"})
# Every dtype torch 2.13 names (tests/runtime/test_device_numpy.py keeps this equal to torch's own list):
# a manifest naming anything else is malformed.
NAMES = NUMPY_TWINS | frozenset({
    "bfloat16", "complex32", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
    "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "qint8", "qint32", "quint8",
    "quint4x2", "quint2x4", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2",
    *(f"int{n}" for n in range(1, 8)), *(f"uint{n}" for n in range(1, 8))})


def numpy_dtype(name: str) -> Any:
    """The numpy dtype named ``name``, or None where numpy has none (bfloat16, float8...)."""
    if name not in NUMPY_TWINS:
        return None
    import numpy as np
    return np.dtype(name)


def torch_dtype(name: str) -> Any:
    """``torch.<name>``; only called where torch is in use."""
    import torch
    return getattr(torch, name)


def name_of(value: Any) -> str:
    """The manifest name of a tensor's or an array's dtype: 'float32'."""
    return str(value.dtype).removeprefix("torch.")
