"""What the target contract's files share: every registered target's name (and the toy's),
the toy registered for a module that asks, the zoo's captured programs."""

from __future__ import annotations

import pytest
import torch

from exporter.model.zoo import ZOO
from runtime.executors import kinds
from targets import all_targets, get_target, register
from targets.registry import unregister
from tests.toy_target import ToyTarget
from tests.toy_target.executor import BACKEND

NAMES = sorted({*all_targets(), ToyTarget.name})


def available(name: str):
    """The target, or a skip saying why this machine cannot build for it."""
    target = get_target(name)
    availability = target.availability()
    if not availability.ok:
        pytest.skip(f"target {name} cannot build here: {availability.reason}")
    return target


@pytest.fixture(scope="module")
def toy_registered():
    """The registry line a new target needs (for the module that uses it only); it registers
    the toy's executor kind too (its packaging.runtime_modules; the validation process
    imports them)."""
    register(ToyTarget())
    assert BACKEND in kinds(), "registering the target registered its executor kind"
    yield
    # The executor kind stays: it is registered by importing a module, which happens once
    # per process, so a later module's registration could not bring it back.
    unregister(ToyTarget.name)


@pytest.fixture(scope="module")
def zoo_programs():
    programs = {}
    for name, factory in ZOO.items():
        module, args, dynamic = factory()
        programs[name] = torch.export.export(module, args, dynamic_shapes=dynamic)
    return programs
