"""The build's line about an hf: model's example inputs: which dims are dynamic, and how to
make the static ones otherwise."""

from __future__ import annotations

from exporter.report.console import model_line

BERT = {"task": "text-classification", "model_class": "Bert", "seq_len": 16}


def test_static_examples_name_the_flags_for_batch_and_length():
    line = model_line({**BERT, "batch_size": 1})
    assert "example inputs: batch 1, sequence 16, static (--batch-size N, --seq-len N;" in line
    assert "--dynamic batch=MIN..MAX" in line


def test_a_dynamic_batch_is_not_called_static():
    line = model_line({**BERT, "batch_size": 2, "dynamic_dims": {"batch": [1, 8]}})
    assert "batch 2 (dynamic 1..8), sequence 16 static (--seq-len N;" in line
    assert "--batch-size" not in line


def test_a_dynamic_length_with_a_minimum_says_to_pad_with_attention_mask_zero():
    line = model_line({**BERT, "dynamic_dims": {"sequence": [8, 128]}})
    assert "sequence 16 (dynamic 8..128; pad a shorter text to 8 tokens, attention_mask 0" in line
    # the static batch is said static beside itself, not after the dynamic sequence
    assert "batch 1 static (--batch-size N; dynamic: --dynamic batch=MIN..MAX), sequence" in line
    assert not line.endswith("static")


def test_image_examples_name_the_batch_and_size_flags():
    line = model_line({"task": "image-classification", "model_class": "ViT", "image_size": 32,
                       "batch_size": 4})
    assert "batch 4, 32-pixel images, static (--batch-size N, --image-size N;" in line
