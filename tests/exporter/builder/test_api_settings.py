"""The Python API's settings: a mistake is the tool's own UserInputError naming the
setting (with the nearest known name), never pydantic's ValidationError."""

from __future__ import annotations

import pydantic
import pytest

import exporter
from exporter.errors import UserInputError


def test_a_misspelled_setting_is_a_user_input_error_with_did_you_mean():
    with pytest.raises(UserInputError) as info:
        exporter.build("zoo:mlp", targt="cpu")
    assert not isinstance(info.value, pydantic.ValidationError)
    assert "targt" in str(info.value) and "did you mean 'target'" in str(info.value)


def test_a_bad_value_is_a_user_input_error_naming_the_setting():
    with pytest.raises(UserInputError, match="seq_len"):
        exporter.build("zoo:mlp", target="cpu", seq_len=-1)
