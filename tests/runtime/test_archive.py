"""Tests for runtime.format.archive: deterministic atomic writes, and a reader that refuses bad files."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import zipfile
from pathlib import Path

import pytest

from runtime.format.archive import FORMAT_NAME, FORMAT_VERSION, MANIFEST_NAME, ArtifactReader, Limits
from exporter.ship.archive_writer import write_artifact
from runtime.errors import ArtifactError, CompatibilityError
from tests.archive_helpers import flip_byte, info, middle_of_entry, record, write_zip

# Pseudo-random, so deflate cannot shrink it and a flipped byte lands in real entry data.
PAYLOAD = b"".join(hashlib.sha256(i.to_bytes(4, "little")).digest() for i in range(4096))
FILES = {"weights.safetensors": PAYLOAD, "lib/kernel.so": b"\x7fELF" + bytes(300),
         "notes.txt": b"hello\n", "partitions/p0/model.onnx": b"\x08\x07" + bytes(200)}
FORMAT = {"name": FORMAT_NAME, "version": FORMAT_VERSION}


def build(tmp_path: Path, files=None, manifest=None, name="model.edge") -> Path:
    return write_artifact(tmp_path / name, manifest or {"toolchain": {"version": "0.1"}},
                          FILES if files is None else files)


def craft(path: Path, entries, manifest="auto", fmt=FORMAT) -> Path:
    """A zip of ``entries`` (as write_zip takes them) after a manifest.json: a dict, bytes,
    "auto" (a correct manifest for `entries`) or None (no manifest.json at all)."""
    if manifest == "auto":
        manifest = {"format": fmt, "entries": {
            (e[0].filename if isinstance(e[0], zipfile.ZipInfo) else e[0]): record(e[1])
            for e in entries}}
    if manifest is not None:
        text = manifest if isinstance(manifest, bytes) else json.dumps(manifest)
        entries = [(MANIFEST_NAME, text), *entries]
    return write_zip(path, entries)


def open_error(path: Path, exc=ArtifactError, limits: Limits = Limits()) -> str:
    with pytest.raises(exc) as caught:
        ArtifactReader.open(path, limits)
    message = str(caught.value)
    assert str(path) in message and "Try:" in message, message
    return message


# ---------------------------------------------------------------------------- writer

def test_round_trip(tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(PAYLOAD * 3)
    files = {**FILES, "big.bin": big}
    path = build(tmp_path, files, manifest={"toolchain": {"version": "0.1"}, "entries": "junk"})
    with ArtifactReader.open(path) as reader:
        assert reader.path == path
        assert reader.names() == sorted(files)
        assert reader.manifest["toolchain"] == {"version": "0.1"}
        assert reader.manifest["format"] == FORMAT
        assert reader.manifest["entries"]["big.bin"] == record(PAYLOAD * 3)
        for name, value in FILES.items():
            assert reader.read_bytes(name) == value
        assert reader.read_bytes("big.bin") == PAYLOAD * 3


def test_manifest_argument_is_not_modified(tmp_path):
    manifest = {"toolchain": {"version": "0.1"}}
    build(tmp_path, manifest=manifest)
    assert manifest == {"toolchain": {"version": "0.1"}}


def test_layout_is_fixed(tmp_path):
    path = build(tmp_path)
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        text = zf.read(MANIFEST_NAME).decode()
    assert [i.filename for i in infos] == sorted([*FILES, MANIFEST_NAME])
    for i in infos:
        assert i.date_time == (1980, 1, 1, 0, 0, 0)
        assert i.external_attr >> 16 == stat.S_IFREG | 0o644
        assert i.create_system == 3
        # Weight-like entries are stored (float data barely deflates); the rest deflated.
        stored = i.filename.endswith((".safetensors", ".pt2", ".data", ".bin", ".params",
                                      ".onnx", ".pte"))
        assert i.compress_type == (zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED)
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_same_inputs_give_identical_bytes(tmp_path):
    src = tmp_path / "w.bin"
    src.write_bytes(PAYLOAD)
    first = build(tmp_path, {**FILES, "w.bin": src}, name="a.edge")
    reordered = dict(reversed(list({**FILES, "w.bin": PAYLOAD}.items())))
    second = build(tmp_path, reordered, name="b.edge")
    assert first.read_bytes() == second.read_bytes()


def test_failed_write_keeps_old_dest_and_leaves_no_temp(tmp_path, monkeypatch):
    dest = tmp_path / "model.edge"
    dest.write_bytes(b"old artifact")
    with pytest.raises(FileNotFoundError):
        build(tmp_path, {"a.bin": tmp_path / "does-not-exist"})
    assert dest.read_bytes() == b"old artifact"

    def fail_replace(*args):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", fail_replace)
    with pytest.raises(OSError, match="disk full"):
        build(tmp_path)
    assert dest.read_bytes() == b"old artifact"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.edge"]


@pytest.mark.parametrize("files, exc", [
    ({"../x": b""}, ValueError), ({"/etc/x": b""}, ValueError), ({"a\\x": b""}, ValueError),
    ({"a//b": b""}, ValueError), ({MANIFEST_NAME: b"{}"}, ValueError),
    ({"a": b"", "a/b": b""}, ValueError), ({"a": "text, not bytes"}, TypeError),
])
def test_writer_rejects_bad_input(tmp_path, files, exc):
    with pytest.raises(exc):
        build(tmp_path, files)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------- hostile files

def set_flag(bits):
    def fix(zi):
        zi.flag_bits |= bits
    return fix


ZEROS = bytes(50 << 20)
HOSTILE = [
    # id, entries for craft(), the substrings the message must contain
    ("dotdot", [("../x", b"1")], ["'../x'", "unsafe entry name"]),
    ("absolute", [("/etc/x", b"1")], ["'/etc/x'", "absolute"]),
    ("backslash", [(info("a\\x"), b"1")], [repr("a\\x"), "backslash"]),
    ("drive", [("C:x", b"1")], ["'C:x'", "drive letter"]),
    ("nul", [(info("a\x00b"), b"1")], [repr("a\x00b"), "NUL"]),
    ("empty-part", [("a//b", b"1")], ["'a//b'", "empty"]),
    ("dot-part", [("a/./b", b"1")], ["'a/./b'"]),
    ("long-part", [("x" * 256, b"1")], ["255 bytes"]),
    ("file-and-dir", [("a", b"1"), ("a/b", b"2")], ["'a'", "both as a file and as a directory"]),
    ("symlink", [(info("link", stat.S_IFLNK | 0o777), b"/etc/passwd")], ["'link'", "symbolic"]),
    ("directory", [(info("d/", stat.S_IFDIR | 0o755), b"")], ["'d/'", "directory"]),
    ("fifo", [(info("p", stat.S_IFIFO | 0o644), b"")], ["'p'", "not a regular file"]),
    ("duplicate", [("w.bin", b"1"), ("w.bin", b"2")], ["'w.bin'", "duplicate"]),
    ("encrypted", [("w.bin", b"secret", set_flag(0x1))], ["'w.bin'", "encrypted"]),
    ("zip-bomb", [("zeros.bin", ZEROS)], ["'zeros.bin'", "zip bomb"]),
]


@pytest.mark.parametrize("entries, expected", [c[1:] for c in HOSTILE],
                         ids=[c[0] for c in HOSTILE])
def test_hostile_entries_are_refused(tmp_path, entries, expected):
    message = open_error(craft(tmp_path / "bad.edge", entries))
    for text in expected:
        assert text in message, message


def test_structure_is_checked_before_the_manifest_is_parsed(tmp_path):
    message = open_error(craft(tmp_path / "bad.edge", [("../x", b"1")], b"{not json"))
    assert "'../x'" in message and "JSON" not in message, message


def manifest_with(**changes) -> dict:
    return {"format": FORMAT, "entries": {"a.bin": record(b"a")}, **changes}


BAD_MANIFESTS = [
    ("missing", None, ArtifactError, "no manifest.json"),
    ("not-json", b"{not json", ArtifactError, "not valid UTF-8 JSON"),
    ("not-utf8", b'{"x": "\xff"}', ArtifactError, "not valid UTF-8 JSON"),
    ("array", b"[]", ArtifactError, "not a JSON object"),
    ("duplicate-key", b'{"entries": {}, "entries": {}}', ArtifactError, "duplicate key"),
    ("nan", b'{"x": NaN}', ArtifactError, "NaN"),
    ("huge-number", b'{"x": ' + b"9" * 5000 + b"}", ArtifactError, "not valid UTF-8 JSON"),
    ("deep-nesting", b"[" * 100_000 + b"]" * 100_000, ArtifactError, "not valid UTF-8 JSON"),
    ("no-format", {"entries": {}}, ArtifactError, "format is not"),
    ("wrong-name", manifest_with(format={"name": "zip", "version": "1.0"}), ArtifactError,
     "format is not"),
    ("bad-version", manifest_with(format={**FORMAT, "version": "one"}), ArtifactError,
     "'one'"),
    ("unknown-major", manifest_with(format={**FORMAT, "version": "2.0"}), CompatibilityError,
     "version 2.0 is not supported; this toolchain reads version 1.0"),
    ("no-entries", manifest_with(entries=None), ArtifactError, "no 'entries'"),
    ("bad-record", manifest_with(entries={"a.bin": {"sha256": "x", "size": 1}}), ArtifactError,
     "'a.bin'"),
]


@pytest.mark.parametrize("manifest, exc, expected", [c[1:] for c in BAD_MANIFESTS],
                         ids=[c[0] for c in BAD_MANIFESTS])
def test_bad_manifest_is_refused(tmp_path, manifest, exc, expected):
    message = open_error(craft(tmp_path / "bad.edge", [("a.bin", b"a")], manifest), exc)
    assert expected in message and repr(MANIFEST_NAME) in message, message


def test_higher_minor_version_is_accepted(tmp_path):
    path = craft(tmp_path / "x.edge", [("a.bin", b"a")], fmt={**FORMAT, "version": "1.7"})
    with ArtifactReader.open(path) as reader:
        assert reader.read_bytes("a.bin") == b"a"


def test_extra_and_missing_entries_are_all_reported(tmp_path):
    listed = {"format": FORMAT, "entries": {"a.bin": record(b"a"), "gone1": record(b""),
                                            "gone2": record(b"")}}
    path = craft(tmp_path / "x.edge", [("a.bin", b"a"), ("extra1", b""), ("extra2", b"")], listed)
    message = open_error(path)
    for name in ["gone1", "gone2", "extra1", "extra2"]:
        assert repr(name) in message, message
    assert "'a.bin'" not in message


@pytest.mark.parametrize("record_change, expected", [
    ({"sha256": "0" * 64}, "SHA-256 does not match"),
    ({"size": 2}, "size 1 does not match"),
    ({"size": 10**30}, "size 1 does not match"),
])
def test_manifest_hash_or_size_mismatch(tmp_path, record_change, expected):
    manifest = manifest_with(entries={"a.bin": {**record(b"a"), **record_change}})
    message = open_error(craft(tmp_path / "x.edge", [("a.bin", b"a")], manifest))
    assert expected in message and "'a.bin'" in message and "modified" in message, message


def test_flipped_byte_in_entry_data(tmp_path):
    path = build(tmp_path)
    with zipfile.ZipFile(path) as zf:
        zi = zf.getinfo("weights.safetensors")
    raw = bytearray(path.read_bytes())
    start = zi.header_offset + 30 + len(zi.filename) + len(zi.extra)  # local header is 30 bytes
    raw[start + zi.compress_size // 2] ^= 0x01
    path.write_bytes(raw)
    message = open_error(path)
    assert "'weights.safetensors'" in message and "modified or corrupted" in message, message


def test_entries_verified_on_threads_name_the_first_bad_entry_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr("runtime.format.hashing.THREADED_BYTES", 0)  # large artifacts' path
    bad = {"sha256": "0" * 64, "size": 1}
    entries = [(name, b"a") for name in ("a.bin", "b.bin", "c.bin", "d.bin")]
    manifest = manifest_with(entries={"a.bin": record(b"a"), "b.bin": bad, "c.bin": record(b"a"),
                                      "d.bin": bad})
    message = open_error(craft(tmp_path / "x.edge", entries, manifest))
    assert "'b.bin'" in message and "'d.bin'" not in message, message
    path = build(tmp_path)
    with ArtifactReader.open(path) as reader:
        assert reader.read_bytes("weights.safetensors") == PAYLOAD


def test_every_single_byte_flip_is_refused_or_harmless(tmp_path):
    """Fuzz: flip each byte of a small artifact; the reader must never crash another way."""
    good = build(tmp_path, {"a.bin": b"abc" * 20, "b/c.so": b"\x7fELF"}).read_bytes()
    bad = tmp_path / "bad.edge"
    refused = 0
    for offset in range(len(good)):
        raw = bytearray(good)
        raw[offset] ^= 0xFF
        bad.write_bytes(raw)
        try:
            with ArtifactReader.open(bad) as reader:
                # Accepted only if the flip hit bytes nothing depends on (timestamps, ...).
                assert reader.read_bytes("a.bin") == b"abc" * 20
        except (ArtifactError, CompatibilityError):
            refused += 1
    assert refused > len(good) // 2


@pytest.mark.parametrize("content", [b"", b"hello, not a zip", b"PK\x03\x04" + bytes(40)],
                         ids=["empty", "text", "zip-header-only"])
def test_not_a_zip(tmp_path, content):
    path = tmp_path / "x.edge"
    path.write_bytes(content)
    assert "not a valid artifact" in open_error(path)


@pytest.mark.parametrize("keep", [0.5, 0.99], ids=["half", "tail-cut"])
def test_truncated(tmp_path, keep):
    path = build(tmp_path)
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep)])
    assert "truncated" in open_error(path)


def test_missing_file_and_directory(tmp_path):
    assert "not found" in open_error(tmp_path / "nope.edge")
    assert "not a regular file" in open_error(tmp_path)
    os.mkfifo(tmp_path / "fifo")  # opening a FIFO would block: it must be refused unopened
    assert "not a regular file" in open_error(tmp_path / "fifo")


@pytest.mark.parametrize("limits, expected", [
    (Limits(max_archive_bytes=1000), "Limits.max_archive_bytes = 1000 bytes"),
    (Limits(max_entries=3), "over the limit of 3"),
    (Limits(max_entry_bytes=1000), "'weights.safetensors'"),
    (Limits(max_manifest_bytes=100), "'manifest.json'"),
])
def test_limits(tmp_path, limits, expected):
    assert expected in open_error(build(tmp_path), limits=limits)


@pytest.mark.parametrize("field", ["max_archive_bytes", "max_entry_bytes", "max_total_bytes"])
def test_a_file_past_a_size_limit_is_told_the_limit_its_size_and_the_call_that_loads_it(
        tmp_path, field):
    """An fp32 1B-class artifact is past the defaults (4 GiB a file, 2 GiB an entry); the
    same refusal, from limits lowered to a small file's size, says which limit, the size,
    and a runtime.load call whose limits then read the file."""
    import dataclasses
    import re

    import runtime
    path = build(tmp_path)
    message = open_error(path, limits=dataclasses.replace(Limits(), **{field: 1000}))
    assert f"over runtime.load's limit Limits.{field} = 1000 bytes" in message, message
    size = int(re.search(r"is (?:\d+ bytes|[\d.]+ GiB) \((\d+) bytes\)", message).group(1))
    assert size > 1000 and size <= path.stat().st_size * 200, message
    call = re.search(r"limits=(runtime\.Limits\((\w+=\d+ << 30(, )?)+\))", message).group(1)
    with ArtifactReader.open(path, eval(call, {"runtime": runtime})) as reader:
        assert reader.manifest


# ---------------------------------------------------------------------------- reading

def test_read_bytes_of_unknown_name(tmp_path):
    with ArtifactReader.open(build(tmp_path)) as reader:
        with pytest.raises(ArtifactError, match="'nope'"):
            reader.read_bytes("nope")
        with pytest.raises(ArtifactError, match="'manifest.json'"):
            reader.read_bytes(MANIFEST_NAME)


def test_extract_private(tmp_path):
    with ArtifactReader.open(build(tmp_path)) as reader:
        root = reader.extract_private()
        assert stat.S_IMODE(root.stat().st_mode) == 0o700
        extracted = sorted(p for p in root.rglob("*") if p.is_file())
        assert [p.relative_to(root).as_posix() for p in extracted] == sorted(FILES)
        for p in extracted:
            assert p.resolve().is_relative_to(root.resolve())
            assert stat.S_IMODE(p.stat().st_mode) == 0o600
            assert p.read_bytes() == FILES[p.relative_to(root).as_posix()]
        only = reader.extract_private(["lib/kernel.so"])
        assert only != root
        assert [p.name for p in only.rglob("*") if p.is_file()] == ["kernel.so"]
        with pytest.raises(ArtifactError, match="'../x'"):
            reader.extract_private(["../x"])
    assert not root.exists() and not only.exists()  # close() removes private copies


def test_file_changed_after_open_is_caught_on_extract_and_read(tmp_path):
    path = build(tmp_path)
    with ArtifactReader.open(path) as reader:
        # in place: the reader's open handle sees the change
        flip_byte(path, middle_of_entry(path, "weights.safetensors"))
        with pytest.raises(ArtifactError, match="'weights.safetensors'"):
            reader.extract_private()
        with pytest.raises(ArtifactError, match="'weights.safetensors'"):
            reader.read_bytes("weights.safetensors")
        assert reader.read_bytes("notes.txt") == b"hello\n"
