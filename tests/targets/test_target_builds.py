"""A real build through every registered target (and the toy): tests/models/custom_op.py's
head model (linear, relu, then a custom op no target knows), once per target, through the
Python API, with its validation in a separate process. That build is where lower() is
watched, where the artifact is loaded fresh and compared with eager, and where the
placement must delegate something and send the custom op to the CPU fallback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import runtime
from exporter.builder.pipeline import build
from exporter.builder.preload import preload_for
from exporter.settings import BuildSettings
from targets import Lowered, Support, get_target, register
from targets.registry import unregister
from tests.targets.conftest import NAMES, available
from tests.toy_target import ToyTarget

pytestmark = pytest.mark.usefixtures("toy_registered")


# imported as a module, not loaded by path: a second load of the file would register its
# custom op again in this process (other tests import tests.models.custom_op too)
CUSTOM = "tests.models.custom_op:head_factory"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """target name -> the custom-op model's build: (result, lower() calls, sandbox, out)."""
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = _watched_build(available(name), tmp_path_factory.mktemp(name))
        return cache[name]
    return get


# What this process writes while a watched lower() runs: (event, path). An audit hook
# cannot be removed, so it is installed once, by the first watched build (not at
# collection: every worker would call it on each audited event, id() included, for the
# whole run), and records only while _WRITES is a list.
_WRITES: list[tuple[str, str]] | None = None
_HOOKED = False
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _audit(event: str, args: tuple) -> None:
    if _WRITES is None:
        return
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        mode, flags = args[1], args[2] or 0
        if (any(c in mode for c in "wax+") if isinstance(mode, str) else flags & _WRITE_FLAGS):
            _WRITES.append((event, os.fsdecode(args[0])))
    elif event in ("os.mkdir", "os.remove", "os.rmdir"):
        # (path, [mode,] dir_fd): a name under a directory descriptor is inside a folder
        # whose own removal is seen (shutil.rmtree); making a folder that exists is no write
        if args[-1] is None and not (event == "os.mkdir" and os.path.isdir(args[0])):
            _WRITES.append((event, os.fsdecode(args[0])))
    elif event in ("os.symlink", "os.link"):
        _WRITES.append((event, os.fsdecode(args[1])))
    elif event in ("os.rename", "shutil.copyfile", "shutil.copytree", "shutil.move"):
        _WRITES.append((event, os.fsdecode(args[1])))


def _hook_once() -> None:
    global _HOOKED
    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED = True


def _outside(writes: list[tuple[str, str]], allowed: list[Path], temp: Path, test_root: Path
             ) -> list[tuple[str, str]]:
    """Writes under none of ``allowed`` and not in the temporary folder (the test's own
    folder, which holds the output and the working directory, is not temporary here);
    Python's own bytecode caches aside."""
    def under(path: Path, roots: list[Path]) -> bool:
        return any(path == root or root in path.parents for root in roots)
    wrong = []
    for event, name in writes:
        path = Path(os.path.abspath(name))
        if "__pycache__" in path.parts or path.parts[1:2] == ("dev",) or under(path, allowed):
            continue  # bytecode caches; /dev/null as a subprocess's stdout
        if under(path, [temp]) and not under(path, [test_root]):
            continue
        wrong.append((event, name))
    return wrong


def _watched_build(target, root: Path):
    """Build with lower() watched: every file it returns lies under its work folder; every
    write this process makes meanwhile lands there, in the system's temporary folder
    (compiler caches), or in a temporary the toolchain recorded (runtime/host/scratch.py,
    removed or swept later); nothing is left beside the output or in the current
    directory."""
    import tempfile

    from runtime.host import scratch
    _hook_once()
    sandbox, out_dir = root / "cwd", root / "out"
    sandbox.mkdir()
    out_dir.mkdir()
    calls: list[dict] = []
    real_lower, real_record = target.lower, scratch.record

    def watched(program, options) -> Lowered:
        global _WRITES
        work, recorded = options.work_dir.resolve(), []

        def record(path: Path) -> Path:
            recorded.append(Path(os.path.abspath(path)))
            return real_record(path)
        scratch.record, _WRITES = record, []
        try:
            lowered = real_lower(program, options)
        finally:
            writes, _WRITES, scratch.record = _WRITES, None, real_record
        temp = Path(os.path.abspath(tempfile.gettempdir()))
        calls.append({"work_dir": work, "outside": [
            str(p) for p in lowered.files.values() if work not in Path(p).resolve().parents],
            "writes": len(writes), "writes_elsewhere": _outside(
                writes, [work, *recorded], temp, Path(os.path.abspath(root))),
            "beside_output": sorted(os.listdir(out_dir)), "in_cwd": sorted(os.listdir(sandbox))})
        return lowered

    target.lower = watched  # an instance attribute: this target object only
    here = os.getcwd()
    os.chdir(sandbox)
    try:
        result = build(CUSTOM, BuildSettings(
            target=target.name, out=out_dir / f"custom-{target.name}.artifact"))
    finally:
        os.chdir(here)
        del target.lower
    return result, calls, sandbox, out_dir


@pytest.mark.parametrize("name", NAMES)
def test_lower_writes_only_under_its_work_folder(name, built):
    result, calls, sandbox, out_dir = built(name)
    assert calls, f"{name}: no partition was lowered"
    for call in calls:
        assert not call["outside"], f"{name} returned files outside its work folder: {call}"
        assert not call["writes_elsewhere"], f"{name} wrote outside its folders: {call}"
        assert call["beside_output"] == [] and call["in_cwd"] == [], call
    assert os.listdir(sandbox) == [] and os.listdir(out_dir) == [result.artifact.name]


@pytest.mark.parametrize("name", NAMES)
def test_the_artifact_loads_fresh_matches_eager_and_delegates(name, built, tmp_path):
    result, *_ = built(name)
    manifest = runtime.read_manifest(result.artifact)
    # validation loaded the artifact in its own process, as a device would
    assert manifest.validation["passed"] is True, manifest.validation
    backends = [p.backend for p in manifest.partitions]
    target = get_target(name)
    assert target.backend in backends, f"{name}: nothing delegated ({backends})"
    custom = [row for row in manifest.coverage if "soft_clip" in row["op"]]
    assert custom and all(row["backend"] == "torch" and row["reason"] for row in custom)
    # the fallback takes only what the target declined (--min-partition-size is 1)
    misplaced = [row for row in manifest.coverage
                 if row["supported"] != (row["backend"] == target.backend)]
    assert not misplaced, misplaced
    # and once more in a fresh process, as on a device: `python -m runtime run`, with
    # the model's own file that registers the op shipped beside it (`--preload FILE.py`)
    from tests.models import custom_op
    model, (x,), _ = custom_op.head_factory()
    folder = tmp_path
    np.savez(folder / "in.npz", **{manifest.signature.inputs[0].name: x.numpy()})
    preload = [a for source in preload_for(manifest, custom_op.__file__)
               for a in ("--preload", source)]
    ran = subprocess.run([sys.executable, "-m", "runtime", "run", str(result.artifact),
                          "--inputs", str(folder / "in.npz"), "--out", str(folder / "out.npz"),
                          "--quiet", *preload], capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr
    (got,) = np.load(folder / "out.npz").values()
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), model(x), rtol=1e-4, atol=1e-5)


class _StrayToy(ToyTarget):
    """A broken target: its lower() also leaves a file in the working directory, and one
    of its support decisions has no reason."""
    name = "stray-toy"

    def supports(self, node):
        support = super().supports(node)
        return support if support.ok else Support(False, "")

    def lower(self, program, options):
        Path("stray.txt").write_text("written outside the work folder")
        return super().lower(program, options)


def test_the_contract_checks_catch_a_broken_target(tmp_path, zoo_programs):
    """The suite's checks fail where they should: a write outside the work folder is
    seen (by the audit hook and in the working directory), and an empty reason is what the
    decision check rejects (a text option without examples: test_target_contract.py)."""
    target = register(_StrayToy())
    try:
        _, calls, _, _ = _watched_build(target, tmp_path)
    finally:
        unregister(_StrayToy.name)
    assert any(path.endswith("stray.txt") for _, path in calls[0]["writes_elsewhere"])
    assert calls[0]["in_cwd"] == ["stray.txt"]
    node = next(n for n in zoo_programs["mlp"].graph.nodes
                if n.op == "call_function" and not target.supports(n).ok)
    assert target.supports(node).reason.strip() == ""  # what the decision check rejects
