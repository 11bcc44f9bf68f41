"""Default artifact names from the spec's file and factory, and the near name of a
misspelled model file or factory."""

import pytest

from exporter.errors import SpecError
from exporter.model.spec import load_spec
from exporter.model.spec_names import default_stem, same_spec


@pytest.mark.parametrize("source, stem", [
    ("my_model.py:factory", "my_model"), ("models/resnet.py:factory", "resnet"),
    ("models.py:resnet18", "models-resnet18"), ("nets.py:make_model", "nets"),
    ("nets.py:get_model", "nets"), ("nets.py:create_model", "nets"), ("nets.py:build", "nets"),
    ("nets.py:model", "nets"), ("nets.py:BuildModel", "nets"),
    ("mypkg.nets:tiny_bert", "nets-tiny_bert"), ("resnet18.py:resnet18", "resnet18"),
    ("zoo:mlp", "mlp"), ("hf:./tiny-bert/", "tiny-bert"), ("python:Sequential", "Sequential")])
def test_default_names_come_from_the_file_and_a_specific_factory(source, stem):
    assert default_stem(source) == stem


def test_two_files_whose_factories_are_both_named_factory_get_two_names():
    assert default_stem("my_model.py:factory") != default_stem("resnet.py:factory")
    assert default_stem("a/models.py:resnet18") != default_stem("a/models.py:resnet50")


def test_one_model_spelled_two_ways_is_one_spec():
    assert same_spec("./m.py:f", "m.py:f") and same_spec("hf:./bert/", "hf:bert")
    assert not same_spec("m.py:f", "m.py:g") and not same_spec("a.py:f", "b.py:f")


def test_a_misspelled_factory_is_told_the_near_callable_of_its_file(tmp_path):
    (tmp_path / "nets.py").write_text("import torch\n\ndef tiny_resnet():\n    pass\n\n"
                                      "class Helper:\n    pass\n")
    with pytest.raises(SpecError, match=r"no attribute 'tiny_resnt' \(did you mean "
                                        r"'tiny_resnet'\?\)"):
        load_spec(f"{tmp_path}/nets.py:tiny_resnt")
    with pytest.raises(SpecError, match=r"did you mean 'Helper'"):
        load_spec(f"{tmp_path}/nets.py:helper")


def test_a_misspelled_model_file_is_told_the_near_file_in_its_folder(tmp_path):
    (tmp_path / "my_model.py").write_text("def factory():\n    pass\n")
    with pytest.raises(SpecError, match=r"my_modle\.py does not exist \(did you mean "
                                        r"'my_model\.py'\?\)") as caught:
        load_spec(f"{tmp_path}/my_modle.py:factory")
    assert f"{tmp_path}/my_model.py:factory" in caught.value.hint
    with pytest.raises(SpecError) as unlike:  # nothing near: no guess
        load_spec(f"{tmp_path}/zzz.py:factory")
    assert "did you mean" not in str(unlike.value)
