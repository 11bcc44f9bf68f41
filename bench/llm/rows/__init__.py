"""The onnx target's own kernels (targets/onnx/kernels) on plain ONNX models, for the bench
probes that time ONNX Runtime's ops against ours outside an artifact
(``bench.llm.ort_int8_paths --rows``, ``ort_attention --rows``, ``ort_profile --rows``):
``opened_with_rows()`` rewrites every session opened inside it the way a build rewrites
its model. An artifact built by the onnx target carries the kernels itself.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from targets.onnx.kernels import LIBRARY, compile_library
from targets.onnx.kernels.rewrite import rewrite

CACHE = Path(__file__).resolve().parents[3] / "build" / "llm" / "rows"
_REGISTERED: dict[int, object] = {}  # session options holding the library (kept alive)


def library() -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    return compile_library(CACHE / LIBRARY)


@contextlib.contextmanager
def opened_with_rows(counts: list[int] | None = None):
    """Every ``onnxruntime.InferenceSession`` opened inside runs its MatMulNBits nodes
    with the library; ``counts`` collects the nodes moved per session."""
    import onnx
    import onnxruntime as ort

    plain, lib = ort.InferenceSession, str(library())

    class WithRows(plain):
        def __init__(self, path, sess_options=None, *args, **kwargs):
            sess_options = sess_options or ort.SessionOptions()
            if id(sess_options) not in _REGISTERED:  # ORT refuses a domain twice
                sess_options.register_custom_ops_library(lib)
                _REGISTERED[id(sess_options)] = sess_options
            given = isinstance(path, bytes)  # a serialized model, or its file
            model = (onnx.load_from_string(path) if given
                     else onnx.load(str(path), load_external_data=False))
            moved = sum(rewrite(model).values())
            if counts is not None:
                counts.append(moved)
            if moved and given:
                path = model.SerializeToString()
            elif moved:  # beside the original: its external data files are relative to it
                path = Path(path).with_name(Path(path).stem + ".rows.onnx")
                onnx.save(model, str(path))
            super().__init__(path if given else str(path), sess_options, *args, **kwargs)

    ort.InferenceSession = WithRows
    try:
        yield
    finally:
        ort.InferenceSession = plain


