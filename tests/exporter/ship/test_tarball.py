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


def test_texts_are_deflated_and_tar_unpacks_every_member(tmp_path):
    """Wheels and artifacts (zips already) go in stored, the rest deflated: the .tar.gz is
    several gzip members, which `tar xzf` (what the README runs) unpacks whole."""
    import shutil
    import subprocess
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(os.urandom(1 << 20))
    text = b"echo the same line again\n" * 40000  # 1 MB that deflates to a few KB
    members = {"run.sh": text, "wheels/w.whl": wheel, "README.txt": b"hi\n"}
    out = tmp_path / "bundle.tar.gz"
    write_tar(out, "bundle", members, lambda m: m.endswith(".sh"))
    size = out.stat().st_size
    assert (1 << 20) < size < (1 << 20) + (64 << 10)  # the 1 MB text deflated
    if shutil.which("tar"):
        subprocess.run(["tar", "xzf", str(out), "-C", str(tmp_path)], check=True)
        assert (tmp_path / "bundle" / "run.sh").read_bytes() == text
        assert (tmp_path / "bundle" / "wheels" / "w.whl").read_bytes() == wheel.read_bytes()
