"""The target contract, for every registered target (and a toy one registered here): a
new target gets these tests by registering. Targets this machine cannot build for skip,
saying why (`exporter targets`). What a target declares: a decision with a reason for every
op, the documented required part and its facets, its options as flags and config keys.
A real build through each target: test_target_builds.py."""

from __future__ import annotations

import json
import logging
import re

import pytest

from exporter.builder.pipeline import dry_run
from exporter.builder.placement import UnsupportedOpsError
from exporter.config import config_file
from exporter.settings import BuildSettings
from targets import Support, Target, get_target
from tests.conftest import ROOT
from tests.targets.conftest import NAMES, available
from tests.toy_target import ToyTarget

pytestmark = pytest.mark.usefixtures("toy_registered")


@pytest.mark.parametrize("name", NAMES)
def test_every_op_of_the_zoo_gets_a_decision_with_a_reason(name, zoo_programs):
    target = available(name)
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
def test_fallback_forbid_lists_every_unsupported_op(name, tmp_path):
    available(name)
    spec = "tests.models.custom_op:twice_factory"  # two custom-op nodes at least
    prep = dry_run(spec, BuildSettings(target=name, fallback="allow", out=tmp_path / "a"))
    unsupported = {row["node"] for row in prep.placement.coverage if not row["supported"]}
    assert len(unsupported) >= 2, f"{name}: {unsupported} (it supports the custom op?)"
    with pytest.raises(UnsupportedOpsError) as info:
        dry_run(spec, BuildSettings(target=name, fallback="forbid", out=tmp_path / "a"))
    listed = {line.split("(", 1)[1].split(")", 1)[0] for line in info.value.details}
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
    assert spec == "zoo:mlp" and again.options() == settings.options()
    assert again.model_dump(mode="json") == settings.model_dump(mode="json")
    if target.Options.model_fields:
        assert f"[{name}]" in text  # the target's own table
    json.dumps(again.target_options)  # the manifest records them as JSON


def test_a_text_option_without_examples_cannot_be_round_tripped():
    """The round trip needs a value other than the default: a text option without
    examples gives none, and the suite says so instead of proving nothing."""
    from pydantic import Field
    from pydantic.fields import FieldInfo
    field: FieldInfo = Field("a", description="text")
    field.annotation = str
    with pytest.raises(AssertionError, match="examples"):
        _not_default(field)


def test_quieting_the_backends_loggers_reads_the_cards_alone():
    """The CLI quiets every target's chatty loggers before a command's work; it reads the
    names from the cards, so running an artifact imports no target's lowering (each one
    about a CPU second at every `exporter run`). The registry refuses a card whose names
    differ from its implementation's (get_target compares them)."""
    import subprocess
    import sys
    from targets.registry import BUILTIN
    implementations = [line.partition(":")[0] for _, line in BUILTIN]
    code = ("import logging, sys\n"
            "from exporter.cli.common import quiet_torch_logs\n"
            "quiet_torch_logs()\n"
            f"print([m for m in {implementations!r} if m in sys.modules])\n"
            "print(logging.getLogger('onnx_ir').level)\n")
    lines = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           cwd=ROOT, check=True).stdout.split()
    assert lines == ["[]", str(logging.ERROR)]
    for name in NAMES:
        get_target(name)  # raises where a card and its implementation disagree
