"""bench/int4_rows_gate.py: the eager stand-in for an int4-weight cuda build holds exactly
the weights the int4 kernels compute with, and is judged by the validation's own gate."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bench.int4_rows_gate import gate, rounded  # noqa: E402
from targets.aoti.kernels import int4_rows, reference  # noqa: E402


def _tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=128, initializer_range=0.02)
    return transformers.LlamaForCausalLM(config).eval()


def test_rounded_linears_hold_what_the_int4_rows_give_and_the_model_is_untouched():
    model = _tiny_llama()
    before = model.model.layers[0].mlp.down_proj.weight.clone()
    copied = rounded(model)
    for name in ("model.layers.0.mlp.down_proj", "model.layers.1.self_attn.q_proj", "lm_head"):
        weight = model.get_submodule(name).weight
        packed, scales = int4_rows.pack(weight.half(), int4_rows.group_of(weight.shape[1]))
        assert torch.equal(copied.get_submodule(name).weight, reference.int4_weight(packed, scales))
    assert torch.equal(model.model.layers[0].mlp.down_proj.weight, before)
    table = copied.get_input_embeddings().weight  # int8 rows: at most 255 values a row
    assert all(len(row.unique()) <= 255 for row in table)


def test_gate_judges_the_validations_cases_teacher_forced():
    found = gate(_tiny_llama(), max_context=64, chunk=32)
    assert found["cases"] == len(found["rows"]) == 4
    assert [r["prompt_tokens"] for r in found["rows"]] == [1, 9, 32, 48]
    assert 0.0 <= found["top1_agreement"] <= 1.0 and found["mean_kl"] > 0.0
