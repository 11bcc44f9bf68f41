"""The staged artifact a build validates becomes the final file: the same bytes a fresh
write gives, its entries copied as validated, refused if it changed since."""

from __future__ import annotations

import hashlib
import os
import zipfile

import pytest

from exporter.ship.archive_writer import _identity, stage_artifact, write_artifact
from runtime.errors import ArtifactError
from runtime.format.archive import ArtifactReader

PAYLOAD = b"".join(hashlib.sha256(i.to_bytes(4, "little")).digest() for i in range(2048))
BEFORE = {"toolchain": {"version": "0.1"}}
AFTER = {**BEFORE, "validation": {"passed": True, "cases": ["x" * 300]}}  # a longer manifest


@pytest.fixture(autouse=True)
def threaded(monkeypatch):
    """Entries copied side by side, as an artifact past 64 MiB's are."""
    monkeypatch.setattr("runtime.format.hashing.THREADED_BYTES", 0)


def files(tmp_path):
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(PAYLOAD * 4)
    return {"weights/shared-00001.safetensors": weights, "generation/tokenizer.json": b"{}" * 900,
            "partitions/p0/model.pt2": PAYLOAD, "partitions/p0/notes.txt": b"hello\n"}


@pytest.mark.parametrize("zip64_limit", [None, 4096], ids=["plain", "zip64"])
def test_finished_artifact_has_the_bytes_of_a_fresh_write(tmp_path, monkeypatch, zip64_limit):
    if zip64_limit:  # entries and offsets past the limit take zipfile's zip64 records
        monkeypatch.setattr(zipfile, "ZIP64_LIMIT", zip64_limit)
    sources = files(tmp_path)
    staged = stage_artifact(tmp_path / ".staged", BEFORE, sources)
    with ArtifactReader.open(staged.path) as reader:
        assert "validation" not in reader.manifest
    staged.finish(tmp_path / "final.artifact", AFTER)
    write_artifact(tmp_path / "fresh.artifact", AFTER, sources)
    assert (tmp_path / "final.artifact").read_bytes() == (tmp_path / "fresh.artifact").read_bytes()
    with ArtifactReader.open(tmp_path / "final.artifact") as reader:
        assert reader.manifest["validation"]["passed"] is True
        assert reader.read_bytes("partitions/p0/model.pt2") == PAYLOAD


@pytest.mark.parametrize("entry", ["partitions/p0/model.pt2", "generation/tokenizer.json"],
                         ids=["stored", "deflated"])
@pytest.mark.parametrize("same_times", [False, True], ids=["new-times", "same-times"])
def test_a_staged_artifact_changed_since_staging_is_refused(tmp_path, entry, same_times):
    staged = stage_artifact(tmp_path / ".staged", BEFORE, files(tmp_path))
    dest = tmp_path / "final.artifact"
    dest.write_bytes(b"the previous artifact")
    with open(staged.path, "r+b") as fh:  # same size, one byte of entry data flipped
        fh.seek(staged.spans[entry][0] + 30 + len(entry) + 2)  # past the local header
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 1]))
    if same_times:  # as a change within one tick of the file system's clock would leave them
        staged.identity = _identity(os.stat(staged.path))
    with pytest.raises(ArtifactError, match="changed while the artifact was being written"):
        staged.finish(dest, AFTER)
    assert dest.read_bytes() == b"the previous artifact"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".staged", "final.artifact",
                                                          "w.safetensors"]


def test_staging_never_writes_through_a_link(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"keep")
    (tmp_path / ".staged").symlink_to(target)
    staged = stage_artifact(tmp_path / ".staged", BEFORE, files(tmp_path))
    assert target.read_bytes() == b"keep" and not staged.path.is_symlink()
