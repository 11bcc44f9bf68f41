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
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import runtime
from exporter.builder.pipeline import build, dry_run
from exporter.builder.preload import preload_for
from exporter.builder.placement import UnsupportedOpsError
from exporter.config import config_file
from exporter.model.zoo import ZOO
from exporter.settings import BuildSettings
from runtime.executors import kinds, unregister_executor
from targets import Lowered, Support, Target, all_targets, get_target, register
from targets.registry import unregister
from tests.toy_target import ToyTarget
from tests.toy_target.executor import BACKEND
from tests.conftest import ROOT

# imported as a module, not loaded by path: a second load of the file would register its
# custom op again in this process (other tests import tests.models.custom_op too)
CUSTOM = "tests.models.custom_op:head_factory"
NAMES = sorted({*all_targets(), ToyTarget.name})


@pytest.fixture(scope="module", autouse=True)
def toy_registered():
    """The registry line a new target needs (here for this module only); it registers the
    toy's executor kind too (its packaging.runtime_modules; the validation process imports
    them)."""
    register(ToyTarget())
    assert BACKEND in kinds(), "registering the target registered its executor kind"
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


# What this process writes while a watched lower() runs: (event, path). An audit hook
# cannot be removed, so it is installed once and records only while _WRITES is a list.
_WRITES: list[tuple[str, str]] | None = None
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


sys.addaudithook(_audit)


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
def test_declared_attributes_are_ones_the_exporter_knows(name):
    """What a target declares as data, the exporter acts on without asking again: its
    device, how a generating step's attention reaches it, and each facet of the kind the
    core asks (a subclass where the target overrides behaviour)."""
    from targets.base import FACETS, STEP_ATTENTION
    target = get_target(name)  # available here or not: these are declarations
    print(name, target.device, target.generation.step_attention)
    assert target.device in ("cpu", "cuda")
    assert target.generation.step_attention in STEP_ATTENTION
    for facet in FACETS:
        assert isinstance(getattr(target, facet), type(getattr(Target, facet))), (name, facet)


def test_the_required_contract_is_the_documented_list():
    """A new target fills nine members, no more: the contract cannot grow silently. What
    else the core asks a target is one of the optional facets, each with defaults; the
    required part is exactly docs/adding-a-target.md's first table."""
    from targets.base import CORE, FACETS
    required = ["name", "device", "backend", "description", "Options",
                "availability", "supports", "default_passes", "lower"]
    assert list(CORE) == required
    assert set(Target.__abstractmethods__) == {"availability", "supports", "default_passes",
                                               "lower"}
    public = {m for m in dir(Target) if not m.startswith("_")} | set(Target.__annotations__)
    assert public == {*required, "own_options", *FACETS}, public ^ {*required, "own_options",
                                                                     *FACETS}
    doc = (ROOT / "docs" / "adding-a-target.md").read_text()
    core_table = doc.split("## The required part", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^\| `(\w+)", core_table, flags=re.M))
    assert named == set(required), named ^ set(required)
    assert all(f"`{facet}`" in doc for facet in FACETS)


def test_the_toy_target_fills_the_core_and_one_facet():
    """The smallest target: the required part, and the packaging facet that names the
    module registering its executor kind; every other facet is the shared default."""
    from targets.base import FACETS
    toy = ToyTarget()
    own = {m for m in vars(ToyTarget) if not m.startswith("_")}
    assert own == {"name", "device", "backend", "description", "Options", "availability",
                   "supports", "default_passes", "lower", "packaging"}, own
    assert [f for f in FACETS if getattr(toy, f) is not getattr(Target, f)] == ["packaging"]


@pytest.mark.parametrize("name", NAMES)
def test_lower_writes_only_under_its_work_folder(name, built):
    result, calls, sandbox, out_dir = built(name)
    assert calls, f"{name}: no partition was lowered"
    for call in calls:
        print(f"{name}: lower() made {call['writes']} write(s) in this process")
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
    spec = "tests.models.custom_op:twice_factory"  # two custom-op nodes at least
    prep = dry_run(spec, BuildSettings(target=name, fallback="allow", out=tmp_path / "a"))
    unsupported = {row["node"] for row in prep.placement.coverage if not row["supported"]}
    assert len(unsupported) >= 2, f"{name}: {unsupported} (it supports the custom op?)"
    with pytest.raises(UnsupportedOpsError) as info:
        dry_run(spec, BuildSettings(target=name, fallback="forbid", out=tmp_path / "a"))
    listed = {line.split("(", 1)[1].split(")", 1)[0] for line in info.value.details}
    print(f"{name}: --fallback forbid lists {sorted(listed)}")
    assert listed == unsupported, (name, listed, unsupported)


def _not_default(field) -> object:
    """A value of an option field other than its default: the field's first other
    example, else one the type gives (a text option without examples is refused: a
    round trip of its default proves nothing)."""
    others = [e for e in (field.examples or []) if e != field.default]
    if others:
        return others[0]
    if field.annotation is bool:
        return not field.default
    if field.annotation in (int, float):
        return field.default + 1
    raise AssertionError(f"option {field} needs examples=[...] for the contract suite")


@pytest.mark.parametrize("name", NAMES)
def test_options_round_trip_through_the_toml_config(name, tmp_path):
    """Every option of the target set to a value other than its default, written to a
    config file by --save-config's writer, read back, the same settings; and each is a
    flag of `exporter build`."""
    from exporter.config.keys import option_owners
    target = get_target(name)
    given = {key: _not_default(field) for key, field in target.Options.model_fields.items()}
    flags = option_owners()
    assert all(name in flags[key][1] for key in given), "each option is a build flag"
    # an option that applies under some recipes only (onnx --quant-block) is refused
    # without one: the first recipe that reads them all
    options = target.Options(**given)
    recipe = next((r for r in [None, *target.quantization.recipes]
                   if not options.unused_with(r)), None)
    settings = BuildSettings(target=name, out=tmp_path / "x.artifact", quantize=recipe, **given)
    assert settings.target_options == {**settings.target_options, **given}, given
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
    seen (by the audit hook and in the working directory), an empty reason is an error,
    and a text option without examples cannot be round-tripped."""
    target = register(_StrayToy())
    try:
        _, calls, sandbox, _ = _watched_build(target, tmp_path)
    finally:
        unregister(_StrayToy.name)
    print("caught:", calls[0]["writes_elsewhere"], calls[0]["in_cwd"])
    assert any(path.endswith("stray.txt") for _, path in calls[0]["writes_elsewhere"])
    assert calls[0]["in_cwd"] == ["stray.txt"]
    node = next(n for n in zoo_programs["mlp"].graph.nodes
                if n.op == "call_function" and not target.supports(n).ok)
    assert target.supports(node).reason.strip() == ""  # what the decision check rejects
    from pydantic import Field
    from pydantic.fields import FieldInfo
    field: FieldInfo = Field("a", description="text")
    field.annotation = str
    with pytest.raises(AssertionError, match="examples"):
        _not_default(field)


def test_cuda_settings_for_decode_steps_need_no_gpu_to_read(tmp_path):
    """The cuda target's recipe for batch-1 decode steps:
    single-row linears become reductions last, after --quantize (--no-fuse keeps them);
    Inductor tunes reductions unless --deterministic; combo kernels only in generating
    builds (shared weights), where they were measured, not with --deterministic, and not in
    programs of dynamic shapes (Inductor's combo kernels refuse a dynamic reduction dim);
    a generating build's sizes read from data hinted as 0 (MVP's positions)."""
    from targets.aoti.passes.row_linears import SingleRowLinearsAsReductions
    from targets.base import LowerOptions
    cuda = get_target("cuda")
    passes = [type(p).__name__ for p in cuda.default_passes(LowerOptions(tmp_path))]
    unfused = cuda.default_passes(LowerOptions(tmp_path, fuse=False))
    print(passes)
    assert passes[-1] == SingleRowLinearsAsReductions.__name__
    assert not any(isinstance(p, SingleRowLinearsAsReductions) for p in unfused)
    flags = [(shared, deterministic, dynamic, data) for shared in (False, True)
             for deterministic in (False, True) for dynamic in (False, True)
             for data in (False, True)]
    for shared, deterministic, dynamic, data in flags:
        configs = cuda.inductor_configs(
            LowerOptions(tmp_path, shared_weights=shared, deterministic=deterministic),
            dynamic, data)
        print(shared, deterministic, dynamic, data, {k: configs.get(k) for k in (
            "coordinate_descent_tuning", "combo_kernels", "unbacked_symint_fallback")})
        assert configs.get("coordinate_descent_tuning", False) is (not deterministic)
        assert configs.get("combo_kernels", False) is (shared and not deterministic
                                                       and not dynamic)
        # a generating build's values read from tensors are positions: hinted as 0 when
        # Inductor runs kernels at compile time, not 8192 (outside a position table)
        assert configs.get("unbacked_symint_fallback") == (0 if shared and data else None)
    # what lower() passes: a symbolic input dim (a prefill's length); a size read from data
    from runtime.executors.torch_fallback import has_dynamic_inputs
    from targets.aoti.base import has_data_dependent_sizes
    rows = torch.nn.Linear(4, 4)
    x = torch.randn(3, 4)
    fixed = torch.export.export(rows, (x,))
    sized = torch.export.export(rows, (x,), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
    assert not has_dynamic_inputs(fixed) and has_dynamic_inputs(sized)

    class FromCacheLength(torch.nn.Module):
        def forward(self, x, start):
            return x[start.item():] * 2
    read = torch.export.export(FromCacheLength(), (x, torch.tensor(1)))
    assert has_data_dependent_sizes(read) and not has_data_dependent_sizes(sized)
