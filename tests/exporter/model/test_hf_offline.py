"""An ``hf:`` spec loads offline (``HF_HUB_OFFLINE=1`` and huggingface_hub's own flag),
and gives both back as the caller had them: a Python caller's later ``from_pretrained``
is not silently offline."""

from __future__ import annotations

import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
constants = pytest.importorskip("huggingface_hub.constants")


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf") / "bert"
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16, num_labels=2)
    ).save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.mark.parametrize("given", [None, "0"], ids=["unset", "zero"])
def test_an_hf_load_is_offline_and_gives_the_setting_back(bert, given, monkeypatch):
    from exporter.model.hf_spec import HfOptions
    from exporter.model.spec import load_spec

    if given is None:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", given)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    seen = []
    read = transformers.AutoConfig.from_pretrained

    def reading(*args, **kwargs):  # what the load runs under
        seen.append((os.environ.get("HF_HUB_OFFLINE"), constants.HF_HUB_OFFLINE))
        return read(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", reading)
    spec = load_spec(f"hf:{bert}", HfOptions(seq_len=8))
    assert spec.details["model_class"] == "BertForSequenceClassification"
    assert seen == [("1", True)]
    assert os.environ.get("HF_HUB_OFFLINE") == given
    assert constants.HF_HUB_OFFLINE is False
