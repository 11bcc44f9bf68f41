"""One shared set of hostile artifacts, each made from a good one, that every loader must
refuse with exit 2 and the same reason (``keyword``, a phrase both loaders' messages hold).

    for case in CASES:
        bad, key = case.make(good, tmp_path / "bad.artifact", keys)

Ideas from tests/runtime/test_archive.py and tests/trust/: names that escape, entries
that are not files, bombs, a manifest that lies or is malformed, signatures that do not
hold, partitions that point outside the artifact. ``key``: the public key the loader
is given (None: no signature check)."""

from __future__ import annotations

import json
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tests.archive_helpers import info, record, write_zip

MANIFEST, SIGNATURE = "manifest.json", "manifest.sig"
# The meta key each native backend opens as its main file (runtime/executors/<kind>.py).
ENTRY_KEYS = {"tvm": "library", "executorch": "program"}


@dataclass(frozen=True)
class Keys:
    """Two Ed25519 key pairs from `exporter keygen`: the signer's and a stranger's."""
    signer_key: Path
    signer_pub: Path
    other_pub: Path


@dataclass(frozen=True)
class Case:
    name: str
    keyword: str  # in both loaders' messages
    make: Callable[[Path, Path, Keys], tuple[Path, Path | None]]


def read(good: Path) -> list[tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(good) as zf:
        return [(info, zf.read(info)) for info in zf.infolist()]


def manifest_of(good: Path) -> dict:
    with zipfile.ZipFile(good) as zf:
        return json.loads(zf.read(MANIFEST))


def rebuilt(good: Path, out: Path, change_manifest=None, *, raw: bytes | None = None,
            extra=(), drop=(), replace=None, method=zipfile.ZIP_DEFLATED) -> Path:
    """The good artifact's entries, with the manifest changed (a function editing the dict,
    or raw bytes), entries added (listed, hashed) or dropped (still listed), or replaced
    (same names, new bytes, old records)."""
    manifest = manifest_of(good)
    for name, data, *_ in extra:
        manifest["entries"][name if isinstance(name, str) else name.filename] = record(data)
    if change_manifest:
        change_manifest(manifest)
    items = [(MANIFEST, raw if raw is not None else json.dumps(manifest).encode())]
    for info, data in read(good):
        if info.filename in (MANIFEST, *drop):
            continue
        items.append((info.filename, (replace or {}).get(info.filename, data)))
    return write_zip(out, [*items, *extra], method)


def biggest_entry(good: Path) -> str:
    infos = [i for i, _ in read(good) if i.filename != MANIFEST]
    return max(infos, key=lambda i: i.file_size).filename


def signed(path: Path, key: Path) -> Path:
    """``path`` with a manifest.sig over its manifest's bytes, as `exporter sign` writes it."""
    from runtime.format.signing import signature_for
    items = [(i.filename, d) for i, d in read(path) if i.filename != SIGNATURE]
    manifest = dict(items)[MANIFEST]
    sig = signature_for(manifest, key.read_bytes(), where=str(key))
    return write_zip(path, [*items, (SIGNATURE, sig)])


def first_partition(manifest: dict) -> dict:
    return manifest["partitions"][0]


# ---------------------------------------------------------------------------- the cases
# Each maker: (good, out, keys) -> (hostile artifact, public key for the loader or None).

def _plain(fn):
    return lambda good, out, keys: (fn(good, out), None)


def _tampered(good, out):
    name = biggest_entry(good)
    data = bytearray(dict((i.filename, d) for i, d in read(good))[name])
    data[len(data) // 2] ^= 0x01  # same size: only the hash can tell
    return rebuilt(good, out, replace={name: bytes(data)})


def _set_record(field, value):
    def make(good, out):
        name = biggest_entry(good)
        return rebuilt(good, out, lambda m: m["entries"][name].update({field: value}))
    return make


def _missing_entry(good, out):
    return rebuilt(good, out, drop=(biggest_entry(good),))


def _unlisted_entry(good, out):
    manifest = manifest_of(good)
    return rebuilt(good, out, lambda m: None, raw=json.dumps(manifest).encode(),
                   extra=[("partitions/extra.bin", b"not listed")])


def _named(name, data=b"x", mode=None):
    return _plain(lambda good, out: rebuilt(good, out, extra=[(info(name, mode), data)]))


def _duplicate(good, out):
    name = biggest_entry(good)
    data = dict((i.filename, d) for i, d in read(good))[name]
    return write_zip(out, [*[(i.filename, d) for i, d in read(good)], (name, data)])


def _encrypted(good, out):
    def flag(zi):
        zi.flag_bits |= 0x1
    return rebuilt(good, out, extra=[("partitions/secret.bin", b"secret", flag)])


def _bomb(good, out):
    return rebuilt(good, out, extra=[("partitions/zeros.bin", bytes(50 << 20))])


def _patched(path: Path, old: bytes, new: bytes) -> Path:
    """``path`` with a name's bytes replaced in both its local and its directory record."""
    raw = path.read_bytes()
    assert raw.count(old) == 2 and len(old) == len(new)
    path.write_bytes(raw.replace(old, new))
    return path


def _local_name_differs(good, out):
    """The directory lists a listed entry whose local header names another file."""
    def rename(zi):
        zi.filename = "partitions/a.bin"  # same length: the offsets still hold
    def move(m):
        m["entries"]["partitions/a.bin"] = m["entries"].pop("partitions/b.bin")
    return rebuilt(good, out, move, extra=[(info("partitions/b.bin"), b"data", rename)])


def _bad_crc(good, out):
    def wrong(zi):
        zi.CRC ^= 1
    return rebuilt(good, out, extra=[(info("partitions/crc.bin"), b"data", wrong)])


def _later_zip_version(good, out):
    def needs(zi):
        zi.extract_version = 64  # one past the last version zipfile reads (6.3)
    return rebuilt(good, out, extra=[(info("partitions/new.bin"), b"data", needs)])


def _name_not_utf8(good, out):
    """A name flagged UTF-8 whose bytes are not (a lead byte without its continuation)."""
    path = rebuilt(good, out, extra=[(info("partitions/\u00e9.bin"), b"data")])
    return _patched(path, "partitions/\u00e9.bin".encode(), b"partitions/\xc3(.bin")


def _cp437_name_unlisted(good, out):
    """An unlisted entry named in CP437 (no UTF-8 flag): byte 0x81 reads as 'u' umlaut."""
    path = rebuilt(good, out, raw=json.dumps(manifest_of(good)).encode(),
                   extra=[("partitions/xx.bin", b"data")])
    return _patched(path, b"partitions/xx.bin", b"partitions/\x81x.bin")


def _oversize_manifest(good, out):
    text = json.dumps(manifest_of(good)).encode()
    padded = text[:-1] + b" " * ((16 << 20) + 1 - len(text)) + b"}"
    return rebuilt(good, out, raw=padded, method=zipfile.ZIP_STORED)


def _raw_manifest(raw: bytes):
    return _plain(lambda good, out: rebuilt(good, out, raw=raw))


def _manifest_change(change):
    return _plain(lambda good, out: rebuilt(good, out, change))


def _format(**fields):
    return _manifest_change(lambda m: m["format"].update(fields))


def _duplicate_key(good, out):
    text = json.dumps(manifest_of(good))
    return rebuilt(good, out, raw=('{"target": "x", ' + text[1:]).encode())


def _truncated(good, out):
    out.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    return out


def _not_a_zip(good, out):
    out.write_bytes(b"hello, not a zip at all")
    return out


def _too_many_entries(good, out):
    extra = [(f"partitions/many/{i}", b"") for i in range(10_001)]
    return rebuilt(good, out, extra=extra, method=zipfile.ZIP_STORED)


def _bzip2(good, out):
    zi = info("partitions/packed.bin")
    zi.compress_type = zipfile.ZIP_BZIP2
    return rebuilt(good, out, extra=[(zi, b"data")])


def _meta_points_outside(good, out):
    def change(m):
        part = first_partition(m)
        part["meta"][ENTRY_KEYS[part["backend"]]] = "../../etc/passwd"
    return rebuilt(good, out, change)


def _meta_points_at_missing(good, out):
    def change(m):
        part = first_partition(m)
        part["meta"][ENTRY_KEYS[part["backend"]]] = f"partitions/{part['name']}/missing.bin"
    return rebuilt(good, out, change)


def _meta_key_missing(good, out):
    def change(m):
        part = first_partition(m)
        del part["meta"][ENTRY_KEYS[part["backend"]]]
    return rebuilt(good, out, change)


def _reads_unknown_tensor(m):
    first_partition(m)["inputs"] = ["nobody_makes_this"]


def _output_made_by_nobody(m):
    m["signature"]["outputs"][0]["name"] = "never_made"


def _no_partitions(m):
    m["partitions"] = []


def _bad_dtype(m):
    m["signature"]["inputs"][0]["dtype"] = "float33"


def _min_over_max(m):
    m["signature"]["inputs"][0]["shape"][0] = {"symbol": "b", "min": 9, "max": 2}


def _no_signature(m):
    del m["signature"]


def _other_platform(m):
    here = m["requirements"]["arch"]
    there = "aarch64" if here != "aarch64" else "x86_64"
    m["requirements"].update(arch=there, platform=f"linux-{there}")


def _cuda_partition(m):
    first_partition(m)["device"] = "cuda"


def _bad_tree(m):
    m["signature"]["output_tree"] = {"kind": "list", "items": [{"leaf": 5}]}


def _unsigned(good, out, keys):
    return rebuilt(good, out), keys.signer_pub


def _untrusted(good, out, keys):
    return signed(rebuilt(good, out), keys.signer_key), keys.other_pub


def _changed_after_signing(good, out, keys):
    signed_path = signed(rebuilt(good, out.with_suffix(".signed")), keys.signer_key)
    items = [(i.filename, d) for i, d in read(signed_path)]
    manifest = json.loads(dict(items)[MANIFEST])
    manifest["target"] = manifest["target"] + " "  # still a valid manifest, not the signed one
    items = [(n, json.dumps(manifest).encode() if n == MANIFEST else d) for n, d in items]
    return write_zip(out, items), keys.signer_pub


def _garbled_signature(good, out, keys):
    items = [(i.filename, d) for i, d in read(rebuilt(good, out))]
    return write_zip(out, [*items, (SIGNATURE, b"{not json")]), keys.signer_pub


def _wrong_algorithm(good, out, keys):
    path = signed(rebuilt(good, out), keys.signer_key)
    items = [(i.filename, d) for i, d in read(path)]
    sig = json.loads(dict(items)[SIGNATURE])
    sig["algorithm"] = "rsa"
    items = [(n, json.dumps(sig).encode() if n == SIGNATURE else d) for n, d in items]
    return write_zip(out, items), keys.signer_pub


CASES = [
    Case("tampered-entry", "SHA-256 does not match the manifest", _plain(_tampered)),
    Case("wrong-hash", "SHA-256 does not match the manifest", _plain(_set_record("sha256", "0" * 64))),
    Case("wrong-size", "does not match the manifest (", _plain(_set_record("size", 7))),
    Case("bad-record", "needs a lowercase hex 'sha256'", _plain(_set_record("sha256", "XYZ"))),
    Case("missing-entry", "disagree on the entries", _plain(_missing_entry)),
    Case("unlisted-entry", "disagree on the entries", _plain(_unlisted_entry)),
    Case("dotdot-name", "unsafe entry name", _named("../evil")),
    Case("absolute-name", "is an absolute path", _named("/tmp/evil")),
    Case("backslash-name", "contains a backslash", _named("partitions\\evil")),
    Case("drive-name", "drive letter", _named("C:evil")),
    Case("control-name", "control character", _named("partitions/a\x01b")),
    Case("nul-name", "contains a NUL", _named("partitions/a\x00b")),
    Case("dot-component", "'.' or '..' path component", _named("partitions/./x")),
    Case("long-component", "longer than 255 bytes", _named("partitions/" + "x" * 256)),
    Case("file-and-directory", "both as a file and as a directory", _named("partitions")),
    Case("symlink-entry", "symbolic link", _named("partitions/link", b"/etc/passwd",
                                                  stat.S_IFLNK | 0o777)),
    Case("directory-entry", "is a directory", _named("partitions/d/", b"", stat.S_IFDIR | 0o755)),
    Case("fifo-entry", "not a regular file", _named("partitions/p", b"", stat.S_IFIFO | 0o644)),
    Case("duplicate-entry", "duplicate entry name", _plain(_duplicate)),
    Case("encrypted-entry", "encrypted", _plain(_encrypted)),
    Case("zip-bomb", "zip bomb", _plain(_bomb)),
    Case("unsupported-compression", "unsupported compression method", _plain(_bzip2)),
    Case("local-name-differs", "entry data is corrupt", _plain(_local_name_differs)),
    Case("bad-crc", "entry data is corrupt", _plain(_bad_crc)),
    Case("name-not-utf8", "not a valid artifact", _plain(_name_not_utf8)),
    Case("needs-later-zip-version", "not a valid artifact", _plain(_later_zip_version)),
    Case("cp437-name-unlisted", "not listed in the manifest: 'partitions/\u00fcx.bin'",
         _plain(_cp437_name_unlisted)),
    Case("too-many-entries", "over the limit of 10000", _plain(_too_many_entries)),
    Case("oversize-manifest", "over the 16777216-byte limit", _plain(_oversize_manifest)),
    Case("no-manifest", "no manifest.json", _plain(lambda good, out: write_zip(
        out, [(i.filename, d) for i, d in read(good) if i.filename != MANIFEST]))),
    Case("manifest-not-json", "not valid UTF-8 JSON", _raw_manifest(b"{not json")),
    Case("manifest-not-utf8", "not valid UTF-8 JSON", _raw_manifest(b'{"x": "\xff"}')),
    Case("manifest-nan", "not valid UTF-8 JSON", _raw_manifest(b'{"x": NaN}')),
    Case("manifest-deep", "not valid UTF-8 JSON", _raw_manifest(b"[" * 100_000 + b"]" * 100_000)),
    Case("manifest-array", "not a JSON object", _raw_manifest(b"[]")),
    Case("manifest-duplicate-key", "duplicate key", _plain(_duplicate_key)),
    Case("wrong-format-name", "manifest format is not", _format(name="zip")),
    Case("bad-format-version", "is not 'major.minor'", _format(version="one")),
    Case("unknown-format-major", "version 2.0 is not supported", _format(version="2.0")),
    Case("truncated", "not a valid artifact", _plain(_truncated)),
    Case("not-a-zip", "not a valid artifact", _plain(_not_a_zip)),
    Case("meta-points-outside", "is not an entry of the artifact", _plain(_meta_points_outside)),
    Case("meta-points-at-missing-file", "is not an entry of the artifact",
         _plain(_meta_points_at_missing)),
    Case("meta-key-missing", "has a malformed meta", _plain(_meta_key_missing)),
    Case("partition-reads-unknown-tensor", "the manifest is inconsistent",
         _manifest_change(_reads_unknown_tensor)),
    Case("output-made-by-nobody", "the manifest is inconsistent",
         _manifest_change(_output_made_by_nobody)),
    Case("no-partitions", "there are no partitions", _manifest_change(_no_partitions)),
    Case("bad-output-tree", "the output tree", _manifest_change(_bad_tree)),
    Case("unknown-dtype", "the manifest is malformed", _manifest_change(_bad_dtype)),
    Case("dim-min-over-max", "the manifest is malformed", _manifest_change(_min_over_max)),
    Case("no-signature-section", "the manifest is malformed", _manifest_change(_no_signature)),
    Case("other-platform", "holds native code compiled for", _manifest_change(_other_platform)),
    Case("cuda-partition", "CUDA", _manifest_change(_cuda_partition)),
    Case("unsigned-but-key-given", "not signed", _unsigned),
    Case("untrusted-signer", "not among the trusted keys", _untrusted),
    Case("changed-after-signing", "signature does not match the manifest", _changed_after_signing),
    Case("garbled-signature", "signature entry is malformed", _garbled_signature),
    Case("wrong-signature-algorithm", "only ed25519 is accepted", _wrong_algorithm),
]
