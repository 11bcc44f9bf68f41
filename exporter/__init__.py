"""The build side: spec loading, capture, the build pipeline, validation, the CLI.

Python API (the CLI calls the same functions)::

    import exporter
    artifact = exporter.build("zoo:mlp", target="cpu", out="mlp.artifact")
    record = exporter.validate("mlp.artifact", "zoo:mlp")
    timings = exporter.bench("mlp.artifact", baselines=("eager",))

Long calls take ``progress=print`` (a ``StageEvent`` per stage start and end) and log
their stages on the ``exporter`` logger.
"""

import importlib

# Imported on first use (PEP 562): a process that needs one light module of the package
# (a matrix cell's Ray worker runs exporter.matrix.cell, which only starts subprocesses)
# should not import torch to get it: workers importing it at once slow the whole matrix.
_PUBLIC = {"Artifact": "exporter.api", "build": "exporter.api", "validate": "exporter.api",
           "bench": "exporter.benchmark", "StageEvent": "exporter.progress",
           "BuildSettings": "exporter.settings"}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'exporter' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
