"""A ``file.py:NAME`` spec runs its file once per content: running it again re-registered
its torch.library ops, which freed the registration the first run's objects still call
(an export in the same process later died in the dispatcher with std::bad_alloc)."""

from __future__ import annotations

from pathlib import Path

from torch._library.custom_ops import OPDEFS

from exporter.model.spec import load_spec
from tests.conftest import ROOT
from tests.models import unconvertible


def test_a_spec_file_already_imported_keeps_its_custom_ops_registered_once():
    spec = load_spec(f"{ROOT / 'tests' / 'models' / 'unconvertible.py'}:mostly_custom_factory")
    assert OPDEFS["edgetest::mix"] is unconvertible.mix  # not replaced by a second run
    assert type(spec.module).__module__ == unconvertible.__name__


def test_an_edited_spec_file_runs_again_and_an_unchanged_one_does_not(tmp_path):
    path = tmp_path / "model.py"
    path.write_text("import torch\nSCALE = 2.0\n"
                    "def factory():\n    return torch.nn.Identity(), (torch.ones(1) * SCALE,)\n")
    first = load_spec(f"{path}:factory")
    again = load_spec(f"{path}:factory")
    assert again.args[0].item() == first.args[0].item() == 2.0
    path.write_text(path.read_text().replace("2.0", "3.0"))
    assert load_spec(f"{path}:factory").args[0].item() == 3.0
