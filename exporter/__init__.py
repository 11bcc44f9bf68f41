"""The build side: spec loading, capture, the build pipeline, validation, the CLI.

Python API (the CLI calls the same functions)::

    import exporter
    artifact = exporter.build("zoo:mlp", target="cpu", out="mlp.artifact")
    record = exporter.validate("mlp.artifact", "zoo:mlp")
    timings = exporter.bench("mlp.artifact", baselines=("eager",))

Long calls take ``progress=print`` (a ``StageEvent`` per stage start and end) and log
their stages on the ``exporter`` logger.
"""

from exporter.api import Artifact, build, validate
from exporter.bench import bench
from exporter.progress import StageEvent
from exporter.settings import BuildSettings

__all__ = ["Artifact", "BuildSettings", "StageEvent", "bench", "build", "validate"]
