"""Typed view of ``manifest.json``.

Plain dataclasses rather than pydantic on purpose: the runtime is what a device
installs alone, docs/architecture.md limits it to torch, numpy and safetensors (and torch
only where a partition needs it: runtime/program/requires.py), and the GPU machine's image has no
pydantic. The exporter builds these objects and the
runtime reads them; ``to_dict``/``from_dict`` are the only (de)serialisers.
Unknown optional keys are ignored when reading, so a newer minor format loads.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from runtime.errors import ArtifactError
from runtime.format.dtypes import NAMES as DTYPE_NAMES
from runtime.generation.section import GenerationSection
from runtime.host.platforms import platform_name


@dataclass(frozen=True)
class Dim:
    """One dimension: ``size`` when static, else a named symbol with inclusive bounds."""

    size: int | None = None
    symbol: str | None = None
    min: int | None = None
    max: int | None = None

    @property
    def is_dynamic(self) -> bool:
        return self.size is None

    def to_json(self) -> int | dict:
        if self.size is not None:
            return self.size
        return {"symbol": self.symbol, "min": self.min, "max": self.max}

    @classmethod
    def from_json(cls, raw: Any) -> "Dim":
        if type(raw) is int:
            return cls(size=_int(raw, "a dimension"))
        low, high = _int(raw["min"], "a dim's min"), _int(raw["max"], "a dim's max")
        if low > high:
            raise ValueError(f"a dim's min {low} is over its max {high}")
        return cls(symbol=_str(raw["symbol"], "a dim's symbol"), min=low, max=high)

    def describe(self) -> str:
        return str(self.size) if self.size is not None else f"{self.symbol}[{self.min}..{self.max}]"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "float32"
    shape: tuple[Dim, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": [d.to_json() for d in self.shape]}

    @classmethod
    def from_json(cls, raw: dict) -> "TensorSpec":
        dtype = _str(raw["dtype"], "a tensor's dtype")
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"{dtype!r:.40} is not a torch dtype")
        return cls(name=_str(raw["name"], "a tensor's name"), dtype=dtype,
                   shape=tuple(Dim.from_json(d) for d in _list(raw["shape"], "a shape")))

    def describe(self) -> str:
        return f"{self.name}: {self.dtype}[{', '.join(d.describe() for d in self.shape)}]"


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # How flat outputs nest (see runtime.program.outputs): lets Program.__call__ return
    # the model's own structure without importing the model's output classes.
    output_tree: Any = None

    def to_json(self) -> dict:
        return {"inputs": [t.to_json() for t in self.inputs],
                "outputs": [t.to_json() for t in self.outputs],
                "output_tree": self.output_tree}

    @classmethod
    def from_json(cls, raw: dict) -> "Signature":
        return cls(inputs=tuple(TensorSpec.from_json(t) for t in _list(raw["inputs"], "inputs")),
                   outputs=tuple(TensorSpec.from_json(t)
                                 for t in _list(raw["outputs"], "outputs")),
                   output_tree=raw.get("output_tree"))


@dataclass(frozen=True)
class Partition:
    """One piece of the program, run by one backend on one device."""

    name: str
    backend: str  # executor kind: "aoti", "onnxruntime", "tvm", "torch"
    device: str  # "cpu" or "cuda"
    files: tuple[str, ...]  # artifact entry names this partition owns
    inputs: tuple[str, ...]  # tensor names read (program inputs or earlier outputs)
    outputs: tuple[str, ...]  # tensor names produced
    meta: dict = field(default_factory=dict)  # backend-specific, e.g. the AOTI package entry

    def to_json(self) -> dict:
        return {"name": self.name, "backend": self.backend, "device": self.device,
                "files": list(self.files), "inputs": list(self.inputs),
                "outputs": list(self.outputs), "meta": self.meta}

    @classmethod
    def from_json(cls, raw: dict) -> "Partition":
        device = _str(raw["device"], "a partition's device")
        if device not in ("cpu", "cuda"):
            raise ValueError(f"a partition's device is {device!r}, not 'cpu' or 'cuda'")
        meta = raw.get("meta") or {}
        if not isinstance(meta, dict):
            raise TypeError("a partition's meta must be an object")
        return cls(name=_str(raw["name"], "a partition's name"),
                   backend=_str(raw["backend"], "a partition's backend"), device=device,
                   files=_strs(raw["files"], "files"), inputs=_strs(raw["inputs"], "inputs"),
                   outputs=_strs(raw["outputs"], "outputs"), meta=dict(meta))


@dataclass(frozen=True)
class Requirements:
    """What the loading machine must have. Checked before any library is loaded."""

    arch: str  # the CPU architecture built for (platform.machine() there), e.g. "x86_64"
    torch: str  # torch version the compiled code was built against
    cpu_isa: str | None = None  # e.g. "avx512", "avx2", "generic"
    cpu_flags: tuple[str, ...] = ()  # /proc/cpuinfo flags the compiled code needs
    cuda: str | None = None  # CUDA version of the build, when a partition runs on a GPU
    cuda_capability: str | None = None  # e.g. "9.0": the oldest GPU the kernels run on
    # the platform built for (runtime/host/platforms.py); older artifacts: linux-<arch>
    platform: str | None = None

    @property
    def platform_name(self) -> str:
        return self.platform or platform_name(self.arch)

    def to_json(self) -> dict:
        data = asdict(self)
        data["cpu_flags"] = list(self.cpu_flags)
        return data

    def describe(self) -> list[str]:
        """For reports: 'x86_64', 'torch 2.13.0', 'CPU ISA avx2 (12 flags)', ..."""
        return [self.platform_name, f"torch {self.torch}",
                *([f"CPU ISA {self.cpu_isa} ({len(self.cpu_flags)} flags)"] if self.cpu_isa
                  else []),
                *([f"CUDA capability >= {self.cuda_capability}"] if self.cuda_capability
                  else [])]

    @classmethod
    def from_json(cls, raw: dict) -> "Requirements":
        optional = {key: _str(raw[key], key) if raw.get(key) is not None else None
                    for key in ("cpu_isa", "cuda", "cuda_capability", "platform")}
        return cls(arch=_str(raw["arch"], "arch"), torch=_str(raw["torch"], "torch"),
                   cpu_flags=_strs(raw.get("cpu_flags") or [], "cpu_flags"), **optional)


@dataclass(frozen=True)
class EntryPoint:
    """A further program of the artifact, beside the main one (a generating artifact's
    ``decode``): its own signature, partitions and arenas, over the same weights."""

    signature: Signature
    partitions: list[Partition]
    memory_plan: dict | None = None
    placement: dict = field(default_factory=dict)
    coverage: list[dict] = field(default_factory=list)
    passes: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"signature": self.signature.to_json(),
                "partitions": [p.to_json() for p in self.partitions],
                "memory_plan": self.memory_plan, "placement": self.placement,
                "coverage": self.coverage, "passes": self.passes}

    @classmethod
    def from_json(cls, raw: dict) -> "EntryPoint":
        return cls(signature=Signature.from_json(raw["signature"]),
                   partitions=[Partition.from_json(p) for p in _list(raw["partitions"],
                                                                      "partitions")],
                   memory_plan=_optional_dict(raw.get("memory_plan"), "memory_plan"),
                   placement=dict(_optional_dict(raw.get("placement"), "placement") or {}),
                   coverage=list(_list(raw.get("coverage") or [], "coverage")),
                   passes=list(_list(raw.get("passes") or [], "passes")))


@dataclass
class Manifest:
    """Everything ``manifest.json`` says, except ``format`` and ``entries`` (owned by
    runtime.format.archive)."""

    target: str
    signature: Signature
    partitions: list[Partition]
    requirements: Requirements
    created_by: dict = field(default_factory=dict)  # toolchain and dependency versions
    source: dict = field(default_factory=dict)  # the spec and what it resolved to
    passes: list[dict] = field(default_factory=list)
    coverage: list[dict] = field(default_factory=list)  # per-op placement and reason
    placement: dict = field(default_factory=dict)  # totals: partitions, transfers, ops by backend
    memory_plan: dict | None = None
    validation: dict | None = None
    build: dict = field(default_factory=dict)  # settings and timings of the build
    # A generating artifact (runtime/generation/): the main program is ``prefill``, its
    # ``decode`` is an entry point, and ``generation`` holds the cache layout, the token
    # ids and the tokenizer's entry. Both empty for other artifacts.
    entry_points: dict[str, EntryPoint] = field(default_factory=dict)
    generation: GenerationSection | None = None
    # The shared weight store (runtime/memory/shared_weights.py): {"entries": {entry: its
    # safetensors index}, "bytes": total}.
    shared_weights: dict | None = None
    entries: dict = field(default_factory=dict)  # filled by the archive writer; read-only here

    def to_dict(self) -> dict:
        return {
            "target": self.target,
            "signature": self.signature.to_json(),
            "partitions": [p.to_json() for p in self.partitions],
            "requirements": self.requirements.to_json(),
            "created_by": self.created_by,
            "source": self.source,
            "passes": self.passes,
            "coverage": self.coverage,
            "placement": self.placement,
            "memory_plan": self.memory_plan,
            "validation": self.validation,
            "build": self.build,
            **({"entry_points": {name: ep.to_json() for name, ep in self.entry_points.items()},
                "generation": self.generation.to_json()} if self.generation is not None
               else {}),
            **({"shared_weights": self.shared_weights} if self.shared_weights else {}),
        }

    def entry_point(self, name: str) -> "Manifest":
        """The manifest as the entry point ``name`` sees it: its signature, partitions and
        memory plan in place of the main program's (so one loader serves both)."""
        ep = self.entry_points[name]
        return replace(self, signature=ep.signature, partitions=list(ep.partitions),
                       memory_plan=ep.memory_plan, placement=ep.placement,
                       coverage=ep.coverage, passes=ep.passes, entry_points={})

    def all_partitions(self) -> list[Partition]:
        """Every partition of every entry point (their files, their backends)."""
        return [*self.partitions, *(p for ep in self.entry_points.values()
                                    for p in ep.partitions)]

    @classmethod
    def from_dict(cls, raw: dict, *, where: str = "manifest.json") -> "Manifest":
        try:
            return cls(
                target=_str(raw["target"], "target"),
                signature=Signature.from_json(raw["signature"]),
                partitions=[Partition.from_json(p) for p in _list(raw["partitions"], "partitions")],
                requirements=Requirements.from_json(raw["requirements"]),
                created_by=dict(_optional_dict(raw.get("created_by"), "created_by") or {}),
                source=dict(_optional_dict(raw.get("source"), "source") or {}),
                passes=list(_list(raw.get("passes") or [], "passes")),
                coverage=list(_list(raw.get("coverage") or [], "coverage")),
                placement=dict(_optional_dict(raw.get("placement"), "placement") or {}),
                memory_plan=_optional_dict(raw.get("memory_plan"), "memory_plan"),
                validation=_optional_dict(raw.get("validation"), "validation"),
                build=dict(_optional_dict(raw.get("build"), "build") or {}),
                entry_points={_str(name, "an entry point's name"): EntryPoint.from_json(ep)
                              for name, ep in (raw.get("entry_points") or {}).items()},
                generation=_generation(raw.get("generation"), where),
                shared_weights=_optional_dict(raw.get("shared_weights"), "shared_weights"),
                entries=dict(raw.get("entries") or {}),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ArtifactError(
                f"the manifest is malformed ({type(exc).__name__}: {exc})", where=where,
                hint="rebuild the artifact with `exporter build`") from exc


# Field checks for from_json: a hostile or hand-edited manifest must fail here, as an
# ArtifactError naming the field, not later as a TypeError deep in the runtime.

def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, not {type(value).__name__}")
    return value


def _int(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value < 1 << 62:
        raise ValueError(f"{what} must be a non-negative integer, not {value!r:.40}")
    return value


def _list(value: Any, what: str) -> list:
    if not isinstance(value, list):
        raise TypeError(f"{what} must be a list, not {type(value).__name__}")
    return value


def _strs(value: Any, what: str) -> tuple[str, ...]:
    return tuple(_str(v, f"an item of {what}") for v in _list(value, what))


def _generation(value: Any, where: str) -> GenerationSection | None:
    # its own ArtifactError names the field (runtime/generation/section.py)
    return None if value is None else GenerationSection.from_json(value, where=where)


def _optional_dict(value: Any, what: str) -> dict | None:
    if value is not None and not isinstance(value, dict):
        raise TypeError(f"{what} must be an object, not {type(value).__name__}")
    return value


@contextmanager
def reading_reports(where: str):
    """Around code that shows a manifest's report sections (coverage, passes, validation,
    memory plan, quantization records): the loader never reads them, so only their
    shallow types are checked above; a field a hand-edited one lacks or mistypes is a
    malformed manifest (exit 2), not a bug of the printer (exit 4)."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ArtifactError(
            f"the manifest's report sections are malformed ({type(exc).__name__}: {exc})",
            where=where, hint="rebuild the artifact with `exporter build`") from exc
