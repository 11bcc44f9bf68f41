"""The generation gate: how it judges tokens and logits, the bounds a user gives, its
float64 reference, and the bisect that names where a generating build parts from eager."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import ROOT
from tests.models import tiny_lm

pytest.importorskip("transformers")


def test_gate_names_the_first_divergence():
    """fp32: tokens that differ where eager is not at a tie fail, naming prompt, step,
    both tokens and the logit error there (exporter/lm/gate.py on made-up results)."""
    from exporter.lm.gate import GenerationGate, judge_case, summary_lines

    vocab, count = 16, 4
    eager_logits = torch.randn(count, vocab, generator=torch.Generator().manual_seed(0),
                               dtype=torch.float64) * 3

    class Eager:  # stands in for the model's full forward (our own function under test)
        note = None  # its float64 forward ran

        def at(self, sequence, start, n, *, float64=False, encoder=None):
            return eager_logits[:n]

    reference = eager_logits.argmax(-1).tolist()
    got_logits = eager_logits.clone().float()
    got_logits[2, 0] = 50.0  # step 2 picks token 0
    tokens = got_logits.argmax(-1).tolist()
    gate = GenerationGate.for_build("fp32", None)
    row = judge_case("case0", Eager(), [1, 2], reference,
                     {"tokens": torch.tensor(tokens), "logits": got_logits,
                      "consistency": got_logits[1]}, gate)
    record = gate.record([row], count)
    lines = summary_lines(record)
    assert not record["passed"]
    assert record["first_divergence"]["step"] == 2 and not record["first_divergence"]["tie"]
    assert "case0 step 2" in lines[1] and "artifact token 0" in lines[1]


def test_gate_bounds_are_the_users_when_given():
    from exporter.lm.gate import GenerationGate
    default = GenerationGate.for_build("fp32", "int4-weight")
    given = GenerationGate.for_build("fp32", "int4-weight", min_top1=0.0, max_kl=10.0)
    assert (default.min_top1, default.max_kl) == (0.70, 0.20)
    assert (given.min_top1, given.max_kl) == (0.0, 10.0) and "--max-kl" in given.failure()


def test_the_float64_reference_runs_mixture_of_experts_models():
    """transformers' default experts kernel (grouped_mm) has no float64 kernel: the
    exact-tokens gate's float64 reference of Qwen2-MoE failed before it ran."""
    import transformers as tf

    from exporter.lm.gate import EagerLogits
    torch.manual_seed(0)
    config = tf.Qwen2MoeConfig(vocab_size=tiny_lm.VOCAB, hidden_size=64, intermediate_size=128,
                               num_hidden_layers=1, num_attention_heads=4,
                               num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                               moe_intermediate_size=32, shared_expert_intermediate_size=64)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    eager = EagerLogits(model)
    l32, l64 = eager.at([5, 6, 7, 8], 1, 3), eager.at([5, 6, 7, 8], 1, 3, float64=True)
    assert l64.dtype == torch.float64 and l64.shape == (3, tiny_lm.VOCAB)
    torch.testing.assert_close(l32.double(), l64, rtol=1e-4, atol=1e-4)


def test_a_divergence_is_bisected_to_the_op_that_parts_from_eager(cli_here, tmp_path):
    """An fp32 generating build that does not generate transformers' tokens says where:
    the step of the first divergence is re-created (the cache filled eagerly), bisected to
    a partition and, inside ONNX Runtime's, to the first value that differs: here the
    router's TopK breaking a tie of all-underflowed scores as torch.topk does not."""
    out = tmp_path / "tie.artifact"
    done = cli_here("build", f"{ROOT / 'tests' / 'models' / 'tie_router.py'}:factory",
                    "--task", "text-generation", "--target", "onnx", "--max-context", "32",
                    "--json", "--out", str(out))
    assert done.returncode == 1 and not out.exists()
    found = json.loads(done.stdout)["validation"]["bisect"]
    assert found["first_divergent"] is not None and "step" in found["case"]
    inside = found["inside"]
    assert inside["backend_op"] == "TopK" and "modeling_afmoe.py" in inside["source"]
    assert "<- first to diverge" in done.stderr and "onnxruntime op TopK" in done.stderr
    kl = json.loads(done.stdout)["validation"]["mean_kl"]
    assert isinstance(kl, float) and kl < 1  # finite: the router's + 1e-20 survived the export
