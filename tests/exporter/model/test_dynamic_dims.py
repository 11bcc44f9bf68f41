"""``--dynamic``: shared dims by name (``batch=``), one input's dim marking its siblings in
an ``hf:`` spec, and examples a dynamic dim can be traced from."""

from __future__ import annotations

import pytest
import torch

from exporter.errors import UserInputError
from exporter.model.dynamic import apply_dynamic, parse_dynamic
from exporter.model.example_dims import fit_examples
from exporter.model.spec import ModelSpec


class TwoInputs(torch.nn.Module):
    def forward(self, x, mask):
        return x * mask


def _shapes(args, texts, groups=None):
    return apply_dynamic(TwoInputs(), args, {}, None, parse_dynamic(texts), groups)


def test_batch_names_dim_zero_of_every_input_as_one_dim():
    shapes = _shapes((torch.ones(2, 3), torch.ones(2, 3)), ["batch=1..8"])
    assert shapes["x"][0] is shapes["mask"][0]
    assert (shapes["x"][0].__name__, shapes["x"][0].min, shapes["x"][0].max) == ("batch", 1, 8)


def test_one_input_dim_leaves_the_other_inputs_named_and_static():
    shapes = _shapes((torch.ones(2, 3), torch.ones(2, 3)), ["x:0=1..8"])
    assert set(shapes) == {"x", "mask"} and shapes["mask"] is None


def test_dynamic_dim_on_a_batch_one_example_says_give_size_two_not_one():
    with pytest.raises(UserInputError) as info:
        _shapes((torch.ones(1, 3), torch.ones(1, 3)), ["x:0=1..8"])
    text = str(info.value) + info.value.hint
    assert "has size 1 on dim 0" in text and "size 2 or more" in text
    assert "every size in 1..8" in text and "= 1" not in text


def test_unknown_shared_dim_name_is_refused_naming_the_known_ones():
    with pytest.raises(UserInputError, match="no dim is named 'length'") as info:
        _shapes((torch.ones(2, 3), torch.ones(2, 3)), ["length=1..8"])
    assert "batch" in info.value.hint


def test_two_ranges_for_one_dim_are_refused():
    with pytest.raises(UserInputError, match="two ranges"):
        _shapes((torch.ones(2, 3), torch.ones(2, 3)), ["batch=1..8", "x:0=1..4"])


def _remade_spec():
    """A spec that can make its examples again (as hf: specs do), batch 1 and length 5."""
    def remake(sizes):
        shape = (sizes.get("batch", 1), sizes.get("sequence", 5))
        return torch.ones(shape), torch.ones(shape)
    groups = {"batch": (("x", 0), ("mask", 0)), "sequence": (("x", 1), ("mask", 1))}
    return ModelSpec("hf:./m", TwoInputs(), remake({}), {}, None, None,
                     details={"batch_size": 1, "seq_len": 5}, groups=groups, remake=remake)


@pytest.mark.parametrize("texts", [["x:0=1..8"], ["batch=1..8"], ["mask:0=1..8"]])
def test_a_spec_that_remakes_examples_traces_a_dynamic_batch_at_two(texts):
    spec = fit_examples(_remade_spec(), parse_dynamic(texts))
    assert [tuple(a.shape) for a in spec.args] == [(2, 5), (2, 5)]
    assert spec.details["batch_size"] == 2 and spec.details["dynamic_dims"] == {"batch": [1, 8]}
    shapes = apply_dynamic(spec.module, spec.args, {}, None, parse_dynamic(texts), spec.groups)
    assert shapes["x"] == shapes["mask"] and shapes["x"][0].__name__ == "batch"


def test_a_sequence_range_above_the_example_length_remakes_it_at_the_minimum():
    spec = fit_examples(_remade_spec(), parse_dynamic(["x:1=8..64"]))
    assert [tuple(a.shape) for a in spec.args] == [(1, 8), (1, 8)]
    assert spec.details["seq_len"] == 8 and spec.details["dynamic_dims"] == {"sequence": [8, 64]}
