"""What a target needs installed, to build and to run, and what its builds cannot pin."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.format.manifest import Partition
from runtime.host.platforms import NAMES, host_platform
from targets.options import LowerOptions

# every platform: for a target whose files hold no native code (ONNX, .pte programs)
PORTABLE = NAMES


@dataclass(frozen=True)
class Packaging:
    # (distribution, pip extra of this project) the build needs beyond torch: doctor lists them
    build_packages: tuple[tuple[str, str], ...] = ()
    # the heavy modules its lowering imports: `exporter matrix` imports them once in each
    # warm worker, not once per cell (exporter/matrix/warm.py); none must start threads
    build_modules: tuple[str, ...] = ()
    # (extra name, requirements) a device needs to run its partitions: the runtime wheel
    runtime_extra: tuple[str, tuple[str, ...]] | None = None
    # modules that register this backend's executor (plug-ins): register() and the
    # validation process import them, as a device does through the entry point
    runtime_modules: tuple[str, ...] = ()
    # the platforms (runtime/host/platforms.py) it builds for; None: this machine's only,
    # the safe default for a target that compiles native code with the host's compiler
    platforms: tuple[str, ...] | None = None

    def builds_for(self, platform: str) -> bool:
        return platform in (self.platforms or (host_platform(),))

    def runtime_packages(self, partition: Partition) -> dict[str, str | None]:
        """Distributions (and the versions it was built with) a device needs to run one
        of this target's partitions, beyond torch, numpy and safetensors: the bundle's lock."""
        return {}

    def nondeterminism(self, options: LowerOptions) -> list[str]:
        """What can make two builds of one spec differ in bytes (the manifest says so)."""
        return []
