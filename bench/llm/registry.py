"""Engines the language-model comparison can run, by name.

An engine is one function, and optionally a second one that converts files first
(``bench.llm.engine``: ``load(req) -> Loaded`` and ``prepare(req) -> None``).

``bench.llm.compare`` runs ``prepare`` in a process of its own (timed, not measured for
memory: a converter's peak is not the engine's), then ``load`` + the protocol in a fresh
process, whose ``ru_maxrss`` is the engine's peak memory. ``prepare`` should skip work whose
output is already in ``req.work_dir`` (the directory is per engine and per checkpoint).

Adding our exported artifact is one line in a module of your own::

    from bench.llm.registry import register_engine
    register_engine("artifact", load_artifact, prepare=build_artifact)

and ``python -m bench.llm.compare --engine-module that.module --engines hf-eager,artifact``
(the module is imported in every engine process too, so the registration is seen there).
Engine modules import their heavy libraries inside the functions, so listing them is cheap.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from bench.llm.engine import EngineRequest, Loaded


@dataclasses.dataclass(frozen=True)
class Engine:
    name: str
    load: Callable[[EngineRequest], Loaded]
    prepare: Callable[[EngineRequest], None] | None = None
    devices: tuple[str, ...] = ("cpu",)


ENGINES: dict[str, Engine] = {}


def register_engine(name: str, load: Callable[[EngineRequest], Loaded],
                    prepare: Callable[[EngineRequest], None] | None = None,
                    devices: tuple[str, ...] = ("cpu",)) -> None:
    ENGINES[name] = Engine(name, load, prepare, tuple(devices))


def get_engine(name: str) -> Engine:
    _register_builtins()
    if name not in ENGINES:
        raise KeyError(f"unknown engine {name!r}; known: {', '.join(sorted(ENGINES))}")
    return ENGINES[name]


def import_engine_modules(modules: list[str]) -> None:
    """Import modules that call register_engine (``--engine-module``)."""
    for module in modules:
        importlib.import_module(module)


def _register_builtins() -> None:
    if "hf-eager" in ENGINES:
        return
    from bench.llm import engines_hf, engines_llamacpp, engines_ortgenai

    register_engine("hf-eager", engines_hf.load_eager, devices=("cpu", "cuda"))
    register_engine("hf-static-compile", engines_hf.load_static_compile,
                    devices=("cpu", "cuda"))
    for quant in engines_llamacpp.QUANTS:
        register_engine(f"llamacpp-{quant.lower()}", engines_llamacpp.loader(quant),
                        prepare=engines_llamacpp.preparer(quant))
    for precision in engines_ortgenai.PRECISIONS:
        register_engine(f"ortgenai-{precision}", engines_ortgenai.loader(precision),
                        prepare=engines_ortgenai.preparer(precision))
