"""Signed artifacts: an Ed25519 signature over ``manifest.json``'s exact bytes.

The manifest pins the SHA-256 and size of every other entry and the reader checks them
all before anything is parsed, so signing the manifest signs the whole artifact. The
signature lives in the ``manifest.sig`` entry (JSON: algorithm, key id, signature in hex),
which is the one entry besides the manifest that the manifest does not list.

    exporter keygen --out-dir keys/            # keys/signing.key (0600), keys/signing.pub
    exporter sign model.artifact --key keys/signing.key
    runtime.load("model.artifact", trusted_keys=["keys/signing.pub"])   # verified, or refused

``cryptography`` is imported only here, when a key is used: a device that never
verifies does not need it (``pip install '.[runtime,signing]'`` for one that does).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable

from runtime.errors import ArtifactError, UserInputError
from runtime.format.archive import SIGNATURE_NAME, ArtifactReader

ALGORITHM = "ed25519"


class SignatureError(ArtifactError):
    """The artifact is unsigned, signed by an untrusted key, or its signature is wrong."""


def _crypto():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise UserInputError("signing and verifying need the 'cryptography' package",
                             hint="pip install cryptography") from None
    return ed25519, serialization, InvalidSignature


def generate_keys(out_dir: Path) -> tuple[Path, Path]:
    """A new key pair: ``signing.key`` (private, PEM, mode 0600) and ``signing.pub``, in
    ``out_dir`` (made, 0700, if missing). Neither file may exist: a key is never
    replaced, and a link or device node in its place is refused, not written through."""
    ed25519, serialization, _ = _crypto()
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserInputError(f"--out-dir {out_dir} is not a directory", where=str(out_dir),
                             hint="give a folder for signing.key and signing.pub")
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    key_path, pub_path = out_dir / "signing.key", out_dir / "signing.pub"
    for path in (key_path, pub_path):
        if path.exists() or path.is_symlink():
            raise UserInputError(f"{path} already exists; not overwriting a key",
                                 hint="choose another --out-dir")
    private = ed25519.Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = private.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    for path, data, mode in ((key_path, pem, 0o600), (pub_path, public, 0o644)):
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        with os.fdopen(os.open(path, flags, mode), "wb") as fh:
            fh.write(data)
    return key_path, pub_path


def signature_for(manifest_bytes: bytes, key_pem: bytes, *, where: str) -> bytes:
    """The ``manifest.sig`` entry for these manifest bytes."""
    ed25519, serialization, _ = _crypto()
    try:
        private = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise UserInputError(f"not a PEM private key ({exc})", where=where,
                             hint="give the signing.key written by `exporter keygen`") from None
    if not isinstance(private, ed25519.Ed25519PrivateKey):
        raise UserInputError("the key is not an Ed25519 key", where=where,
                             hint="give the signing.key written by `exporter keygen`")
    record = {"algorithm": ALGORITHM, "key_id": _key_id(private.public_key()),
              "signature": private.sign(manifest_bytes).hex()}
    return (json.dumps(record, sort_keys=True) + "\n").encode()


def signer_key_id(signature: bytes | None) -> str | None:
    """The key id a signature entry names (None: not signed). Only reads it: ``verify``
    is what checks it."""
    if signature is None:
        return None
    try:
        return str(json.loads(signature)["key_id"])
    except (ValueError, KeyError, TypeError):
        return "unreadable signature entry"


def signature_status(reader: ArtifactReader, trusted_keys: Iterable = ()) -> dict:
    """What can honestly be said about ``reader``'s signature, for ``inspect`` and the
    report: a key id is only "signed by" once a trusted key verified it; otherwise the
    entry is "present, not verified" (it may be stale or garbage: nothing checked it)."""
    raw = reader.signature_bytes()
    status = {"present": raw is not None, "verified": False, "key_id": None,
              "claimed_key_id": signer_key_id(raw), "problem": None}
    if raw is not None and trusted_keys:
        try:
            status["key_id"], status["verified"] = verify(reader, trusted_keys), True
        except SignatureError as exc:
            status["problem"] = exc.what
    return status


def describe_signature(status: dict) -> str:
    if status["verified"]:
        return f"signed by key {status['key_id']} (verified)"
    if not status["present"]:
        return "not signed"
    if status["problem"]:
        return f"signature present, NOT valid: {status['problem']}"
    return ("signature present, not verified (pass --trusted-key signing.pub to check it; "
            f"it names key {status['claimed_key_id']!r})")


def verify(reader: ArtifactReader, trusted_keys: Iterable[str | Path | bytes]) -> str:
    """Check ``reader``'s signature against the trusted public keys; returns the key id."""
    ed25519, serialization, invalid = _crypto()
    keys = {}
    if isinstance(trusted_keys, (str, Path, bytes)):  # one key, not its characters
        trusted_keys = [trusted_keys]
    for key in trusted_keys:
        pem = key if isinstance(key, bytes) else _read_key(Path(key))
        try:
            public = serialization.load_pem_public_key(pem)
        except (ValueError, TypeError) as exc:
            raise UserInputError(f"a trusted key is not a PEM public key ({exc})",
                                 hint="give the signing.pub written by `exporter keygen`") from None
        if isinstance(public, ed25519.Ed25519PublicKey):
            keys[_key_id(public)] = public
    if not keys:
        raise UserInputError("no Ed25519 public key to verify with",
                             hint="give the signing.pub written by `exporter keygen`")
    where = f"{reader.path}, entry {SIGNATURE_NAME!r}"
    raw = reader.signature_bytes()
    if raw is None:
        raise SignatureError("the artifact is not signed, and a signature is required",
                             where=str(reader.path), hint="sign it with `exporter sign`")
    try:
        record = json.loads(raw.decode("utf-8"))
        key_id, signature = record["key_id"], bytes.fromhex(record["signature"])
        algorithm = record["algorithm"]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SignatureError(f"the signature entry is malformed ({type(exc).__name__})",
                             where=where, hint="sign the artifact again") from None
    if algorithm != ALGORITHM:
        raise SignatureError(f"the signature uses {algorithm!r}; only {ALGORITHM} is accepted",
                             where=where, hint="sign the artifact again with `exporter sign`")
    public = keys.get(key_id)
    if public is None:
        raise SignatureError(f"signed by key {key_id!r}, which is not among the trusted keys "
                             f"({', '.join(sorted(keys))})", where=where,
                             hint="add the signer's public key, or do not use this file")
    try:
        public.verify(signature, reader.manifest_bytes)
    except invalid:
        raise SignatureError("the signature does not match the manifest (the artifact was "
                             "changed after it was signed)", where=where,
                             hint="do not use this file; get it again from its signer") from None
    return key_id


def _key_id(public) -> str:
    from cryptography.hazmat.primitives import serialization
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _read_key(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UserInputError(f"cannot read the key ({exc.strerror})", where=str(path)) from None
