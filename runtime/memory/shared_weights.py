"""The artifact's shared weight store: safetensors entries (shards of at most 1 GiB)
holding every tensor that several partitions read (a generating artifact's prefill and decode share all of theirs).

The build keys each tensor by its content (exporter/builder/shared_weights.py), so one
weight compiled into two entry points, or a tied embedding and output head, is stored
once. A partition's meta maps the names its executor uses to those keys
(``PartitionMeta.shared_weights``); executors get the tensors from here, one copy per
device for the whole artifact: a GPU holds each weight once, whatever reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.errors import ArtifactError

if TYPE_CHECKING:  # imported where tensors are made: listing entries needs no torch
    import torch

    from runtime.format.archive import ArtifactReader

PREFIX = "weights/shared-"
SHARD_BYTES = 1 << 30  # an entry stays well under runtime.format.archive.Limits.max_entry_bytes
_REBUILD = "rebuild the artifact with `exporter build`"


def shard_entry(number: int) -> str:
    return f"{PREFIX}{number:05d}.safetensors"


class SharedWeights:
    def __init__(self, reader: ArtifactReader, indexes: dict[str, dict], *, where: str) -> None:
        self._reader, self._indexes, self._where = reader, indexes, where
        self._host: dict[str, torch.Tensor] | None = None
        self._placed: dict[tuple[str, str], torch.Tensor] = {}

    @classmethod
    def from_manifest(cls, record: dict | None, reader: ArtifactReader, *, where: str
                      ) -> "SharedWeights | None":
        if record is None:
            return None
        indexes = record.get("entries") if isinstance(record, dict) else None
        if not isinstance(indexes, dict) or not indexes or not all(
                name == shard_entry(n) for n, name in enumerate(sorted(indexes), start=1)):
            raise ArtifactError("the manifest's shared_weights record is malformed",
                                where=where, hint=_REBUILD)
        return cls(reader, indexes, where=where)

    def tensors(self, names: dict[str, str], device: str | torch.device, *, partition: str
                ) -> dict[str, torch.Tensor]:
        """{name the executor uses: tensor on ``device``} for one partition's mapping."""
        if self._host is None:
            self._host = self._read_store()
        unknown = sorted(key for key in names.values() if key not in self._host)
        if unknown:
            raise ArtifactError(f"partition '{partition}' reads {len(unknown)} tensor(s) the "
                                f"shared store lacks: {', '.join(unknown[:4])}",
                                where=self._where, hint=_REBUILD)
        device = str(device)
        placed = {}
        for name, key in names.items():
            tensor = self._placed.get((key, device))
            if tensor is None:
                tensor = self._host[key] if device == "cpu" else self._host[key].to(device)
                self._placed[(key, device)] = tensor
            placed[name] = tensor
        return placed

    def _read_store(self) -> dict[str, torch.Tensor]:
        """Every shard's tensors, shards side by side on threads (hashing releases the
        GIL); each shard's header is checked against the manifest first."""
        from runtime.format.hashing import each
        from runtime.format.weights import load_entry_checked
        shards = sorted(self._indexes.items())
        entries = self._reader.manifest["entries"]  # a shard it lacks: named when read
        loaded = each(lambda shard: load_entry_checked(
            self._reader, shard[0], shard[1], where=f"{self._where}: {shard[0]}"),
            shards, sum(entries.get(entry, {}).get("size", 0) for entry, _ in shards))
        return {name: tensor for tensors in loaded for name, tensor in tensors.items()}


def missing_store(partition: str, *, where: str) -> ArtifactError:
    return ArtifactError(f"partition '{partition}' reads shared weights, but the artifact has "
                         "no shared weight store", where=where, hint=_REBUILD)
