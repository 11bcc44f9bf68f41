"""Tests for runtime.format.weights.load_entry_checked: a safetensors entry streamed from the
archive into tensors, with no file in between, checked like a file is."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save

import runtime.format.archive as archive
from exporter.ship.archive_writer import write_artifact
from runtime.errors import ArtifactError
from runtime.format.archive import ArtifactReader
from runtime.format.weights import load_entry_checked
from tests.archive_helpers import flip_byte, middle_of_entry

ENTRY = "weights/shared-00001.safetensors"
TENSORS = {
    "w": torch.randn(33, 17),
    "half": torch.randn(5, 3).to(torch.bfloat16),
    "mask": torch.tensor([True, False, True]),
    "ids": torch.arange(7, dtype=torch.int64),
    "scalar": torch.tensor(2.5, dtype=torch.float16),
    "empty": torch.zeros(0, 4),
    "f8": torch.randn(9).to(torch.float8_e4m3fn),
}


def index_of(tensors: dict) -> dict:
    names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.bool: "BOOL",
             torch.int64: "I64", torch.float16: "F16", torch.float8_e4m3fn: "F8_E4M3"}
    return {k: [names[v.dtype], list(v.shape)] for k, v in tensors.items()}


def artifact(tmp_path, data: bytes):
    return write_artifact(tmp_path / "m.edge", {"toolchain": {"version": "0.1"}},
                          {ENTRY: data, "notes.txt": b"x"})


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
def test_tensors_equal_the_files_and_sit_aligned(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(archive, "CHUNK", chunk)  # chunks that split the header and tensors
    with ArtifactReader.open(artifact(tmp_path, save(TENSORS))) as reader:
        got = load_entry_checked(reader, ENTRY, index_of(TENSORS), where="m.edge")
    assert sorted(got) == sorted(TENSORS)
    for name, want in TENSORS.items():
        assert got[name].dtype == want.dtype and got[name].shape == want.shape
        assert torch.equal(got[name].reshape(-1).view(torch.uint8),
                           want.reshape(-1).view(torch.uint8)), name
        if want.numel():
            assert got[name].data_ptr() % 64 == 0, name  # each in its own allocation


def test_an_index_that_differs_from_the_manifest_is_refused_before_allocating(tmp_path,
                                                                             monkeypatch):
    wrong = {**index_of(TENSORS), "w": ["F32", [17, 33]]}
    monkeypatch.setattr(torch, "empty", lambda *a, **k: pytest.fail("allocated"))
    with ArtifactReader.open(artifact(tmp_path, save(TENSORS))) as reader:
        with pytest.raises(ArtifactError, match="does not match the manifest's index") as caught:
            load_entry_checked(reader, ENTRY, wrong, where="m.edge: " + ENTRY)
    assert ENTRY in str(caught.value) and "'w'" in str(caught.value)


@pytest.mark.parametrize("data, expected", [
    (b"\x80\x04(", "shorter than a safetensors header"),
    (struct.pack("<Q", 1 << 40) + b"{}", "the header claims"),
    (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
    (struct.pack("<Q", 2) + b"{}" + b"tail", "the tensors cover 0 bytes"),
])
def test_not_a_safetensors_entry(tmp_path, data, expected):
    with ArtifactReader.open(artifact(tmp_path, data)) as reader:
        with pytest.raises(ArtifactError, match=expected):
            load_entry_checked(reader, ENTRY, {}, where=ENTRY)


def test_gaps_between_tensors_are_refused(tmp_path):
    header = json.dumps({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}).encode()
    data = struct.pack("<Q", len(header)) + header + bytes(8)
    with ArtifactReader.open(artifact(tmp_path, data)) as reader:
        with pytest.raises(ArtifactError, match="overlap or leave gaps"):
            load_entry_checked(reader, ENTRY, {"a": ["F32", [1]]}, where=ENTRY)


def test_an_entry_changed_after_open_is_refused(tmp_path):
    big = {**TENSORS, "w": torch.randn(256, 256)}  # past the open file's read buffer
    path = artifact(tmp_path, save(big))
    with ArtifactReader.open(path) as reader:
        flip_byte(path, middle_of_entry(path, ENTRY))  # the reader's open handle sees it
        with pytest.raises(ArtifactError, match="modified") as caught:
            load_entry_checked(reader, ENTRY, index_of(big), where=ENTRY)
    assert ENTRY in str(caught.value)


def test_no_index_in_the_manifest(tmp_path):
    with ArtifactReader.open(artifact(tmp_path, save(TENSORS))) as reader:
        with pytest.raises(ArtifactError, match="no index of this weights file"):
            load_entry_checked(reader, ENTRY, None, where=ENTRY)


def test_the_store_reads_every_shard_and_names_a_missing_one(tmp_path):
    from runtime.memory.shared_weights import SharedWeights, shard_entry
    second = {"b": torch.ones(3)}
    path = write_artifact(tmp_path / "m.edge", {"toolchain": {"version": "0.1"}},
                          {ENTRY: save(TENSORS), shard_entry(2): save(second)})
    indexes = {ENTRY: index_of(TENSORS), shard_entry(2): index_of(second)}
    with ArtifactReader.open(path) as reader:
        store = SharedWeights.from_manifest({"entries": indexes}, reader, where="m.edge")
        got = store.tensors({"x": "b", "y": "w"}, "cpu", partition="p0")
        assert torch.equal(got["x"], second["b"]) and torch.equal(got["y"], TENSORS["w"])
        lacking = SharedWeights.from_manifest(
            {"entries": {**indexes, shard_entry(3): {}}}, reader, where="m.edge")
        with pytest.raises(ArtifactError, match="entry not found") as caught:
            lacking.tensors({"x": "b"}, "cpu", partition="p0")
    assert shard_entry(3) in str(caught.value)
