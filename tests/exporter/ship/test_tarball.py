"""The bundles' tar writer: the same members give the same .tar.gz bytes, whenever and
under whatever name they are written."""

from __future__ import annotations

import os
import tarfile
import time

from exporter.ship.tarball import write_tar


def test_packing_the_same_members_twice_gives_identical_bytes(tmp_path):
    artifact = tmp_path / "model.artifact"
    artifact.write_bytes(os.urandom(4096))
    members = {"run.sh": b"#!/bin/sh\necho hi\n", "artifacts/model.artifact": artifact}
    first, second = tmp_path / "a" / "bundle.tar.gz", tmp_path / "b" / "other-name.tar.gz"
    first.parent.mkdir(), second.parent.mkdir()
    write_tar(first, "bundle", dict(members), lambda m: m.endswith(".sh"))
    time.sleep(1.1)  # a gzip header with a time in it would differ now
    write_tar(second, "bundle", dict(members), lambda m: m.endswith(".sh"))
    assert first.read_bytes() == second.read_bytes()
    with tarfile.open(first) as tar:
        modes = {m.name: m.mode for m in tar.getmembers()}
    assert modes == {"bundle/artifacts/model.artifact": 0o644, "bundle/run.sh": 0o755}
