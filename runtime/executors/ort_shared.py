"""How an ONNX Runtime session reads the artifact's shared weight store without a copy.

A partition built with shared weights (targets/onnx/shared.py) keeps its large
initializers declared as external data that no file holds; the executor hands ONNX
Runtime the store's tensors for them. Two ways, by what the artifact and ORT can do:

- **files in memory** (artifacts since this module; ORT with
  ``add_external_initializers_from_files_in_memory``): each initializer's external data is
  a file named ``shared_location(name)``, and the executor supplies that file's bytes: the
  store tensor's own memory (the safetensors mapping), which ORT reads in place under
  ``session.use_external_initializer_file_buffers_directly``. A weight no kernel repacks
  (an embedding table, a norm's scale) is then one copy for the whole artifact, whatever
  the number of sessions, and that copy is the mapped file (page cache, not process heap).
- **OrtValues** (``add_external_initializers``; older artifacts all name one location,
  older ORT lacks the above): ORT 1.32 copies each such tensor into every session, measured
  here: a 300M LLaMA's int4 artifact (293 MB) grew 375 MB of heap per session, 125 MB of it
  its fp32 embedding table.

Weights a kernel prepacks (MatMul, MatMulNBits, Conv) get a packed copy per session either
way; ORT's Python API has no shared prepacked-weights container.
"""

from __future__ import annotations

import hashlib

from runtime.errors import CompatibilityError

# Not a file anywhere: the executor supplies its bytes (targets/onnx/shared.py).
_PREFIX = "shared-"
_IN_PLACE = "session.use_external_initializer_file_buffers_directly"


def shared_location(name: str) -> str:
    """The external-data location of shared initializer ``name``: a plain file name
    (what the executor's external-data check accepts), one per initializer, derived from
    the name so the executor needs nothing but the partition's name -> store key map."""
    return _PREFIX + hashlib.sha256(name.encode()).hexdigest()[:24]


def supply_shared(ort, options, tensors: dict, *, in_memory_files: bool, partition: str,
                  where: str) -> list:
    """Hand ``tensors`` ({initializer name: CPU torch tensor}) to ``options``; returns
    what must live as long as the session (ORT reads these buffers, not copies)."""
    if in_memory_files and can_read_files_in_place(options):
        import torch
        # bytes of any dtype (bfloat16 too): ORT takes the declared type from the graph
        files = {shared_location(name): tensor.contiguous().view(-1).view(torch.uint8).numpy()
                 for name, tensor in tensors.items()}
        read_files_in_place(options, files)
        return list(files.values())
    values = []
    for tensor in tensors.values():
        if str(tensor.dtype) == "torch.bfloat16":  # numpy has no bfloat16
            raise CompatibilityError(f"partition '{partition}' shares bfloat16 weights, "
                                     "which this ONNX Runtime cannot take through numpy",
                                     where=where, hint="build onnx at fp32 or fp16, or "
                                                       "update onnxruntime")
        values.append(ort.OrtValue.ortvalue_from_numpy(tensor.numpy()))
    options.add_external_initializers(list(tensors), values)
    return values


def can_read_files_in_place(options) -> bool:
    return hasattr(options, "add_external_initializers_from_files_in_memory")


def read_files_in_place(options, files: dict) -> None:
    """Hand ORT each external-data file's bytes ({location: uint8 numpy buffer}), which
    its session reads in place; the buffers must outlive the session."""
    options.add_external_initializers_from_files_in_memory(
        list(files), list(files.values()), [b.nbytes for b in files.values()])
    options.add_session_config_entry(_IN_PLACE, "1")
