"""Done-when: a model defined outside the repo (a Hugging Face BERT from a small config)
builds for cpu from the CLI, validates, runs from an .npz, and matches eager."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def bert_build(bert_cpu):
    """tests/models/hf_bert.py:tiny_bert built for cpu, batch 1..8 (conftest: one build
    for this file and test_build_cpu's nested outputs)."""
    return bert_cpu


def test_hf_model_builds_and_validates(bert_build):
    out, result = bert_build
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["validation"]["passed"] is True
    outputs = [o["name"] for o in data["signature"]["outputs"]]
    assert outputs == ["last_hidden_state", "pooler_output"]  # ModelOutput keys kept
    batch = data["signature"]["inputs"][0]["shape"][0]
    assert batch["min"] == 1 and batch["max"] == 8
    # both inputs share one batch symbol
    assert data["signature"]["inputs"][1]["shape"][0]["symbol"] == batch["symbol"]


def test_hf_model_runs_from_npz_and_matches_eager(bert_build, cli_here, tmp_path):
    out, result = bert_build
    assert result.returncode == 0, result.stderr
    from tests.models.hf_bert import tiny_bert

    model, _ = tiny_bert()
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 128, size=(3, 12), dtype=np.int64)
    mask = np.ones((3, 12), dtype=np.int64)
    mask[2, 8:] = 0  # padding: exercises the mask path
    np.savez(tmp_path / "in.npz", input_ids=ids, attention_mask=mask)
    run = cli_here("run", str(out), "--inputs", str(tmp_path / "in.npz"),
                   "--out", str(tmp_path / "out.npz"))
    assert run.returncode == 0, run.stderr
    with torch.no_grad():
        expected = model(torch.from_numpy(ids), torch.from_numpy(mask))
    with np.load(tmp_path / "out.npz") as got:
        for name in ("last_hidden_state", "pooler_output"):
            np.testing.assert_allclose(got[name], expected[name].numpy(), rtol=1e-4, atol=1e-4)
