"""The onnx artifacts' decode with our own int8/int4 GEMV kernels (bench/llm/rows) in
place of MLAS's MatMulNBits: ``artifact-onnx-int8-rows`` and ``artifact-onnx-int4-rows``
load the artifacts of ``artifact-onnx-int8`` / ``artifact-onnx-int4`` (built by their
preparers) with every MatMulNBits node moved to the library. A probe of what shipping
such kernels would give, not a build the onnx target makes.

    python -m bench.llm.interleave --engine-module bench.llm.engines_artifact \\
        --engine-module bench.llm.engines_rows --engines artifact-onnx-int8-rows,...
"""

from __future__ import annotations

import contextlib
import dataclasses

from bench.llm.engine import EngineRequest
from bench.llm.engines_artifact import loader, preparer
from bench.llm.registry import register_engine
from bench.llm.rows import opened_with_rows

SOURCES = {"artifact-onnx-int8-rows": "artifact-onnx-int8",
           "artifact-onnx-int4-rows": "artifact-onnx-int4"}


def _prepare(source: str):
    def prepare(req: EngineRequest) -> None:
        preparer(source)(dataclasses.replace(req, work_dir=req.work_dir.parent / source))
    return prepare


@contextlib.contextmanager
def _opening():
    moved: list[int] = []
    with opened_with_rows(moved):
        yield
    if not sum(moved):
        raise RuntimeError("no MatMulNBits node was moved to our kernels")


for _name, _source in SOURCES.items():
    register_engine(_name, loader(_name, _source, _opening,
                                  label="our artifact, our GEMV kernels"),
                    prepare=_prepare(_source))
