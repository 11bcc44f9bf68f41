"""Fuzzing the loader: mutated artifacts must end in a typed error or a valid load, never
another exception, a crash, or a file written outside the private temp directory.

Two mutators, from one small valid artifact (every op on the CPU fallback, so a load
parses export JSON and safetensors too):

* bytes: flips, overwrites, insertions, deletions and truncation anywhere in the zip;
* structure: a JSON value anywhere in the manifest replaced by another (a huge number,
  a wrong type, a deep nesting...), written back with consistent hashes, as an attacker
  who can rewrite an unsigned manifest would.

The default suite runs a few hundred cases; ``-m slow`` runs 100,000 byte mutations
through the reader and the manifest parser (``read_manifest``) and prints the count.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import exporter
import runtime
import tests.models.custom_op  # noqa: F401  registers the custom op the artifact calls
from exporter.ship.archive_writer import write_artifact
from runtime.errors import ToolchainError
from tests.conftest import built_once

HEALTH = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
          HealthCheck.data_too_large]


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> bytes:
    """Built once a run under a name other modules building the same can share (read
    only: the cases mutate copies)."""
    def build(folder):
        # a module spec, as tests/system/test_reliability.py says why
        return exporter.build("tests.models.custom_op:factory", target="onnx",
                              min_partition_size=3, out=folder / "all-fallback.artifact")
    return built_once(tmp_path_factory, "all-fallback-onnx", build).artifact.read_bytes()


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """Loads write only into ``tmp_path/tmp`` (the private copies); the test checks that
    it is empty after each case and that nothing else appeared."""
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _mutate_bytes(data: bytes, edits: list[tuple[int, int, int]], cut: int | None) -> bytes:
    out = bytearray(data)
    for kind, where, value in edits:
        where %= max(len(out), 1)
        if kind == 0:
            out[where] ^= 1 << (value % 8)
        elif kind == 1:
            out[where] = value % 256
        elif kind == 2:
            out[where:where] = bytes([value % 256]) * (1 + value % 7)
        else:
            del out[where:where + 1 + value % 7]
    return bytes(out[:cut] if cut is not None else out)


BYTE_EDITS = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 30), st.integers(0, 255)),
                      min_size=1, max_size=4)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.text(max_size=20)
    | st.sampled_from([10**400, 2**63, -1, 0, "", "../../etc/passwd", "p0", "cuda", "float32"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=6)


def _load(path: Path, sandbox: Path, *, full: bool) -> None:
    before = set(sandbox.iterdir())
    try:
        if full:
            runtime.load(path)
        else:
            runtime.read_manifest(path)
    except ToolchainError:
        pass  # a typed error: what we want (ArtifactError, CompatibilityError, ...)
    left = [p for p in (sandbox / "tmp").iterdir()  # the scratch registry stays by design
            if not p.name.startswith("exporter-scratch-")]
    assert left == [], "private copies are removed"
    assert set(sandbox.iterdir()) == before, "nothing written outside the temp directory"


def _check_bytes(seed: bytes, sandbox: Path, edits, cut, full: bool) -> None:
    path = sandbox / "mutated.artifact"
    path.write_bytes(_mutate_bytes(seed, edits, cut))
    _load(path, sandbox, full=full)


@settings(max_examples=300, deadline=None, suppress_health_check=HEALTH)
@given(edits=BYTE_EDITS, cut=st.none() | st.integers(0, 1 << 20))
def test_byte_mutations_fail_typed(seed, sandbox, edits, cut):
    _check_bytes(seed, sandbox, edits, cut, full=True)


def _paths(value, prefix=()):
    """Every path to a value in a JSON tree."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


@settings(max_examples=150, deadline=None, suppress_health_check=HEALTH)
@given(pick=st.integers(0, 1 << 30), value=JSON_VALUES)
def test_manifest_mutations_fail_typed(seed, sandbox, pick, value):
    with zipfile.ZipFile(io.BytesIO(seed)) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        files = {n: zf.read(n) for n in zf.namelist() if n != "manifest.json"}
    manifest.pop("entries")
    paths = [p for p in _paths(manifest) if p]
    path = paths[pick % len(paths)]
    parent = manifest
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    out = sandbox / "mutated.artifact"
    try:
        write_artifact(out, manifest, files)
    except ValueError:
        return  # not writable as JSON (a number too large): no artifact to load
    _load(out, sandbox, full=True)


@pytest.mark.slow
def test_reader_and_manifest_parser_hold_for_100k_byte_mutations(seed, sandbox):
    import random
    rng = random.Random(0)
    cases = int(os.environ.get("FUZZ_CASES", "100000"))
    for _ in range(cases):
        edits = [(rng.randrange(4), rng.randrange(len(seed)), rng.randrange(256))
                 for _ in range(rng.randint(1, 4))]
        cut = rng.randrange(len(seed)) if rng.random() < 0.1 else None
        _check_bytes(seed, sandbox, edits, cut, full=False)

