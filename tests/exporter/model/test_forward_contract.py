"""forward() fed in a way torch.export words in its own terms (a keyword-only parameter
given positionally, an output class its pytree does not know) is refused with the fix and
the user's source line; the fix it names then builds."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from exporter.errors import SpecError
from exporter.model.capture import capture
from exporter.model.spec import load_spec

SOURCE = textwrap.dedent("""
    import dataclasses
    import torch


    @dataclasses.dataclass
    class Out:
        logits: torch.Tensor
        hidden: torch.Tensor


    class Plain:
        def __init__(self, x):
            self.x = x


    class Returns(torch.nn.Module):
        def __init__(self, kind):
            super().__init__()
            self.kind, self.linear = kind, torch.nn.Linear(4, 4)

        def forward(self, x):
            h = self.linear(x)
            return Out(h.relu(), h) if self.kind == "dataclass" else Plain(h)


    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x, *, scale):
            return self.linear(x) * scale


    def dataclass_out():
        return Returns("dataclass"), (torch.randn(2, 4),)


    def plain_out():
        return Returns("plain"), (torch.randn(2, 4),)


    def scale_positional():
        return Scaled(), (torch.randn(2, 4), torch.randn(2, 4))


    def scale_missing():
        return Scaled(), (torch.randn(2, 4),)


    def scale_by_name():
        return Scaled(), (torch.randn(2, 4),), {"scale": torch.randn(2, 4)}


    def too_many():
        return torch.nn.Linear(4, 4), (torch.randn(2, 4), torch.randn(2, 4))
""")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("contract") / "models.py"
    path.write_text(SOURCE)
    return path


def _refusal(path: Path, factory: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        capture(load_spec(f"{path}:{factory}"), [], "cpu")
    assert info.value.exit_code == 2  # a usage error, not a failed build
    return info.value


def _line(path: Path, text: str) -> str:
    number = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)
    return f"{path}:{number}"


def test_a_dataclass_output_names_register_dataclass_at_its_class(models):
    error = _refusal(models, "dataclass_out")
    assert "torch.utils._pytree.register_dataclass(Out)" in error.hint
    assert "logits, hidden" in error.hint  # what the artifact's outputs will be
    assert error.where.startswith(_line(models, "class Out:"))
    assert "not a known type" not in error.what  # torch's words stay in details only


def test_another_class_names_register_pytree_node(models):
    error = _refusal(models, "plain_out")
    assert "register_pytree_node(Plain" in error.hint
    assert error.where.startswith(_line(models, "class Plain:"))


@pytest.mark.parametrize("factory", ["scale_positional", "scale_missing"])
def test_a_keyword_only_input_says_pass_it_by_name(models, factory):
    error = _refusal(models, factory)
    assert "'scale' by keyword only" in error.what
    assert "{'scale': ...}" in error.hint and "example_kwargs" in error.hint
    assert error.where.startswith(_line(models, "def forward(self, x, *, scale):"))


def test_inputs_forward_cannot_take_are_refused_before_tracing(models):
    error = _refusal(models, "too_many")
    assert "cannot take the example inputs" in error.what


def test_the_fixes_named_capture(models, tmp_path):
    captured = capture(load_spec(f"{models}:scale_by_name"), [], "cpu")
    assert [s.name for s in captured.signature.inputs] == ["x", "scale"]
    registered = tmp_path / "registered.py"
    registered.write_text(SOURCE + "\ntorch.utils._pytree.register_dataclass(Out)\n")
    captured = capture(load_spec(f"{registered}:dataclass_out"), [], "cpu")
    assert [s.name for s in captured.signature.outputs] == ["logits", "hidden"]
