"""What a generating build takes and refuses before capture: recipes, models that cannot
generate from a cache, rotaries that follow the sequence length, contexts, tokenizers;
each refusal exit 2, naming the cause."""

from __future__ import annotations

import pytest
import torch

import exporter
from tests.conftest import ROOT
from tests.models import tiny_lm

pytest.importorskip("transformers")


def test_int8_static_is_refused_for_generating_builds(cli_here, tmp_path):
    """It calibrates on one forward pass's inputs; a step's are cache states (ONNX
    Runtime's attention op refused random positions): exit 2 before any capture."""
    out = tmp_path / "x.artifact"
    done = cli_here("build", f"{ROOT / 'tests' / 'models' / 'tiny_lm.py'}:factory", "--task",
                    "text-generation", "--target", "onnx", "--quantize", "int8-static",
                    "--calibration", "random", "--out", str(out))
    assert done.returncode == 2 and "int8-static does not apply" in done.stderr
    assert "int8-dynamic" in done.stderr and not out.exists()


def test_models_that_cannot_generate_from_a_cache_are_refused_before_capture(cli_here, tmp_path):
    """An encoder loaded as a causal LM (BERT: BertLMHeadModel) attends both ways, ALiBi
    (BLOOM) builds its biases from a 2D mask over the whole sequence, and a tokenizer.json
    that does not load would fail only at validation: each exits 2 at load, naming it."""
    import shutil

    import transformers
    torch.manual_seed(0)
    bert = tmp_path / "bert-mlm"
    transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=120, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64)).save_pretrained(bert)
    bloom = tmp_path / "bloom"
    transformers.BloomForCausalLM(transformers.BloomConfig(
        vocab_size=120, hidden_size=32, n_layer=1, n_head=2)).save_pretrained(bloom)
    folder = tiny_lm.checkpoint(tmp_path / "lm", "llama")
    broken = shutil.copytree(folder, tmp_path / "broken-tokenizer")
    (broken / "tokenizer.json").write_text('{"version": "1.0", ')
    for spec, said in ((bert, "is not a causal decoder"), (bloom, "uses ALiBi position biases"),
                       (broken, "tokenizer.json cannot be read")):
        out = tmp_path / f"{spec.name}.artifact"
        done = cli_here("build", f"hf:{spec}", "--task", "text-generation", "--target", "onnx",
                        "--out", str(out))
        assert done.returncode == 2 and said in done.stderr
        assert "capture" not in done.stderr and not out.exists()


def test_rotaries_that_follow_the_sequence_length(tmp_path):
    """Dynamic-NTK rope branches on the call's last position, which torch.export cannot
    capture; within the model's positions (every --max-context) it is the default rope, and
    builds token for token. Phi-3's longrope past its original context makes transformers
    recompute the whole cache with its long factors: refused (a UserInputError: exit 2,
    naming the limit), and the default context stops at that limit."""
    from exporter.errors import UserInputError
    from exporter.lm.build import dry_run_generating
    from exporter.settings import BuildSettings
    models = ROOT / "tests" / "models" / "tiny_lm.py"
    out = tmp_path / "dynamic.artifact"
    built = exporter.build(f"{models}:llama_dynamic_rope", task="text-generation",
                           target="onnx", max_context=48, out=out)
    record = built.manifest.validation
    assert record["passed"] and record["tokens_identical"]
    with pytest.raises(UserInputError, match="original context of 32") as refused:
        exporter.build(f"{models}:phi3_longrope", task="text-generation", target="onnx",
                       max_context=40, out=tmp_path / "x")
    assert "--max-context 32 or less" in str(refused.value)
    planned = dry_run_generating(f"{models}:phi3_longrope",
                                 BuildSettings(target="onnx", task="text-generation"))
    assert planned.context == 32  # the default context
    planned = dry_run_generating(f"{models}:gemma3_longrope",  # longrope per layer type
                                 BuildSettings(target="onnx", task="text-generation"))
    assert planned.context == 32


def test_a_prefill_chunk_over_the_context_is_refused(onnx_lm):
    """Not cut down to the context in silence: the user asked for something else."""
    from exporter.errors import SpecError
    from exporter.lm.source import load_language_model
    from exporter.model.hf_spec import HfOptions
    built, _ = onnx_lm
    lm = load_language_model(f"hf:{built.artifact.parent / 'tiny-gemma3'}",
                             HfOptions(task="text-generation"))
    assert lm.context_bounds(32, 32) == (32, 32) and lm.context_bounds(32, None) == (32, 32)
    with pytest.raises(SpecError, match="--prefill-chunk 64 is over the context of 32"):
        lm.context_bounds(32, 64)


def test_a_model_that_fails_eagerly_is_said_so_with_its_line(tmp_path):
    """AFMoE's masks need a sliding_window in its config: without one the model raises on
    any input. That is the model's (exit 2, its line), not 'an internal error' (exit 4)."""
    import transformers as tf

    from exporter.errors import SpecError
    config = tf.AfmoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                            head_dim=16, num_experts=2, num_experts_per_tok=1,
                            moe_intermediate_size=16, sliding_window=None)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(SpecError, match="fails in eager PyTorch") as info:
        exporter.build(model, task="text-generation", target="onnx", max_context=16,
                       out=tmp_path / "a.artifact")
    assert "sliding_window" in str(info.value) and "masking_utils.py" in str(info.value)


def test_a_tokenizer_larger_than_the_vocabulary_is_a_note_and_the_validation_stays_inside(
        tmp_path):
    """A tokenizer.json of more tokens than the model's vocabulary: the validation's text
    prompts indexed past the embedding table (exit 4, "IndexError"). Now a note, and the
    prompts keep only ids the model has."""
    from types import SimpleNamespace

    from exporter.lm.source import _check_tokenizer
    from exporter.lm.validate import _tokenized
    path = tmp_path / "tokenizer.json"
    tokenizer = tiny_lm.bpe_tokenizer(tiny_lm.VOCAB, ["<pad>", "<s>", "</s>"], "<s> $A")
    tokenizer.save(str(path))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    assert _check_tokenizer(path, size) == []
    (note,) = _check_tokenizer(path, 200)
    prompts = _tokenized(SimpleNamespace(tokenizer=path), 200)
    assert f"has {size} tokens, the model's vocabulary 200" in note
    assert all(p and max(p) < 200 for p in prompts)


def test_layers_without_a_kv_cache_are_refused_as_the_models_limit():
    """Linear-attention (Qwen3-Next, Jamba, Mamba 2 hybrids) and chunked (Llama 4) layers
    were "an internal error ... a bug in the exporter"; they are a limit of the export:
    exit 2 (a SpecError) naming the layer kind, before any capture."""
    from exporter.errors import SpecError
    from exporter.lm.build import dry_run_generating
    from exporter.settings import BuildSettings
    lm = tiny_lm.model("llama")
    lm.config.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(SpecError, match="linear_attention layers have no KV-cache export"):
        dry_run_generating(lm, BuildSettings(target="onnx", task="text-generation"))
