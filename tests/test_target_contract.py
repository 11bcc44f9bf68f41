"""The target contract, for every registered target (and a toy one registered here): a
new target gets these tests by registering. Targets this machine cannot build for skip,
saying why (`exporter targets`).

Each target builds tests/models/custom_op.py's head model (linear, relu, then a custom op
no target knows) once, through the Python API, with its validation in a separate process: that
build is where lower() is watched, where the artifact is loaded fresh and compared with
eager, and where the placement must delegate something and send the custom op to the CPU
fallback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import runtime
from exporter.builder.pipeline import build, dry_run, preload_for
from exporter.builder.placement import UnsupportedOpsError
from exporter.cli import config_file
from exporter.model.zoo import ZOO
from exporter.settings import BuildSettings
from runtime.executors import register_executor, unregister_executor
from targets import Lowered, Support, all_targets, get_target, register
from targets.registry import unregister
from tests.toy_target import ToyTarget
from tests.toy_target.executor import BACKEND, ToyExecutor

# imported as a module, not loaded by path: a second load of the file would register its
# custom op again in this process (other tests import tests.models.custom_op too)
CUSTOM = "tests.models.custom_op:head_factory"
NAMES = sorted({*all_targets(), ToyTarget.name})


@pytest.fixture(scope="module", autouse=True)
def toy_registered():
    """The registry line a new target needs (here for this module only), and its executor
    kind in this process (the validation process imports tests/toy_target/register.py)."""
    register(ToyTarget())
    register_executor(BACKEND, ToyExecutor, replace=True)
    yield
    unregister(ToyTarget.name)
    unregister_executor(BACKEND)


def _available(name: str):
    target = get_target(name)
    availability = target.availability()
    if not availability.ok:
        pytest.skip(f"target {name} cannot build here: {availability.reason}")
    return target


@pytest.fixture(scope="module")
def zoo_programs():
    programs = {}
    for name, factory in ZOO.items():
        module, args, dynamic = factory()
        programs[name] = torch.export.export(module, args, dynamic_shapes=dynamic)
    return programs


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """target name -> the custom-op model's build: (result, lower() calls, sandbox, out)."""
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = _watched_build(_available(name), tmp_path_factory.mktemp(name))
        return cache[name]
    return get


def _watched_build(target, root: Path):
    """Build with lower() watched: every file it returns lies under its work folder, and
    nothing is written beside the output or in the current directory meanwhile."""
    sandbox, out_dir = root / "cwd", root / "out"
    sandbox.mkdir()
    out_dir.mkdir()
    calls: list[dict] = []
    real_lower = target.lower

    def watched(program, options) -> Lowered:
        lowered = real_lower(program, options)
        work = options.work_dir.resolve()
        calls.append({"work_dir": work, "outside": [
            str(p) for p in lowered.files.values() if work not in Path(p).resolve().parents],
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
    print(f"built {CUSTOM} for {target.name}: "
          f"{[(p.name, p.backend) for p in result.manifest.partitions]}")
    return result, calls, sandbox, out_dir


@pytest.mark.parametrize("name", NAMES)
def test_every_op_of_the_zoo_gets_a_decision_with_a_reason(name, zoo_programs):
    target = _available(name)
    for model, program in zoo_programs.items():
        for node in program.graph.nodes:
            if node.op != "call_function":
                continue
            support = target.supports(node)
            assert isinstance(support, Support), (name, model, node)
            assert isinstance(support.reason, str) and support.reason.strip(), (name, model, node)


@pytest.mark.parametrize("name", NAMES)
def test_lower_writes_only_under_its_work_folder(name, built):
    result, calls, sandbox, out_dir = built(name)
    assert calls, f"{name}: no partition was lowered"
    for call in calls:
        assert not call["outside"], f"{name} returned files outside its work folder: {call}"
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
    # and once more in a fresh process, as on a device: `python -m runtime run`
    from tests.models.custom_op import head_factory
    model, (x,), _ = head_factory()
    folder = tmp_path
    np.savez(folder / "in.npz", **{manifest.signature.inputs[0].name: x.numpy()})
    preload = [a for source in preload_for(manifest, None)
               for a in ("--preload", source)]
    ran = subprocess.run([sys.executable, "-m", "runtime", "run", str(result.artifact),
                          "--inputs", str(folder / "in.npz"), "--out", str(folder / "out.npz"),
                          "--quiet", *preload], capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr
    (got,) = np.load(folder / "out.npz").values()
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), model(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_fallback_forbid_lists_every_unsupported_op(name, tmp_path):
    _available(name)
    spec = CUSTOM
    prep = dry_run(spec, BuildSettings(target=name, fallback="allow", out=tmp_path / "a"))
    unsupported = {row["node"] for row in prep.placement.coverage if not row["supported"]}
    assert unsupported, f"{name} supports the custom op?"
    with pytest.raises(UnsupportedOpsError) as info:
        dry_run(spec, BuildSettings(target=name, fallback="forbid", out=tmp_path / "a"))
    listed = {line.split("(", 1)[1].split(")", 1)[0] for line in info.value.details}
    assert listed == unsupported, (name, listed, unsupported)


@pytest.mark.parametrize("name", NAMES)
def test_options_round_trip_through_the_toml_config(name, tmp_path):
    target = get_target(name)
    settings = BuildSettings(target=name, out=tmp_path / "x.artifact")
    path = config_file.write(tmp_path / "build.toml", "zoo:mlp", settings)
    text = path.read_text()
    spec, fields = config_file.merge(None, {}, set(), path)
    again = BuildSettings(**fields)
    print(f"{name}:\n{text}")
    assert spec == "zoo:mlp" and again.options() == settings.options()
    assert again.model_dump(mode="json") == settings.model_dump(mode="json")
    if target.Options.model_fields:
        assert f"[{name}]" in text  # the target's own table
    json.dumps(again.target_options)  # the manifest records them as JSON
