"""Encoder-only text models from Hugging Face transformers (BERT and its descendants).

Each factory builds the real ``...ForSequenceClassification`` class (ten labels) from a
config object with random weights (unit-scaled: unit_scale.py) and returns
``(model, (), {"input_ids": ..., "attention_mask": ...})`` for one sequence of 16 tokens.

Configs are tiny on purpose (hidden 32-64, 2 layers, 2 heads, vocabulary 512): the suite
covers each architecture's operators and attention variants (absolute, relative,
disentangled, rotary, local/global, convolutional, Fourier), and every model has to export
and compile in seconds on a 2-core machine.
"""

from __future__ import annotations

import torch
import transformers as hf

try:  # a spec file: `exporter build` puts its folder on sys.path, so this folder's own
    from unit_scale import unit_scaled
except ImportError:  # imported as bench.coverage.<file>
    from bench.coverage.unit_scale import unit_scaled

VOCAB, SEQ = 512, 16
_LABELS = 10

# The BERT-style field names most configs here share.
_BERT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=64, max_position_embeddings=64)


def _text_kwargs(vocab: int = VOCAB, seq: int = SEQ) -> dict[str, torch.Tensor]:
    """Random token ids (above the first few special ids, below ``vocab``) and an all-ones
    mask, from a seeded generator."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab, (1, seq), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones(1, seq, dtype=torch.int64)}


def _classifier(model_cls, config):
    """The model in eval mode with its example kwargs, unit-scaled (unit_scale.py); the
    caller has seeded torch. Ten labels, not the configs' two: two logits have one
    difference, a coin toss that can leave them nearly equal (a near-constant output)."""
    config.num_labels = _LABELS
    return unit_scaled(model_cls(config).eval(), (), _text_kwargs())


def bert():
    torch.manual_seed(0)
    return _classifier(hf.BertForSequenceClassification, hf.BertConfig(**_BERT))


def roberta():
    torch.manual_seed(0)
    return _classifier(hf.RobertaForSequenceClassification, hf.RobertaConfig(**_BERT))


def xlm_roberta():
    torch.manual_seed(0)
    return _classifier(hf.XLMRobertaForSequenceClassification, hf.XLMRobertaConfig(**_BERT))


def distilbert():
    torch.manual_seed(0)
    config = hf.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2,
                                 hidden_dim=64, max_position_embeddings=64)
    return _classifier(hf.DistilBertForSequenceClassification, config)


def albert():
    torch.manual_seed(0)
    # Factorized embeddings (16 -> 32) and one layer's weights shared by both layers.
    config = hf.AlbertConfig(**_BERT, embedding_size=16)
    return _classifier(hf.AlbertForSequenceClassification, config)


def electra():
    torch.manual_seed(0)
    config = hf.ElectraConfig(**_BERT, embedding_size=16)
    return _classifier(hf.ElectraForSequenceClassification, config)


def deberta():
    torch.manual_seed(0)
    config = hf.DebertaConfig(**_BERT, relative_attention=True, max_relative_positions=32,
                              pos_att_type=["c2p", "p2c"])
    return _classifier(hf.DebertaForSequenceClassification, config)


def deberta_v2():
    torch.manual_seed(0)
    # Disentangled attention with log-bucketed relative positions, as in DeBERTa-v3.
    config = hf.DebertaV2Config(**_BERT, relative_attention=True, position_buckets=8,
                                max_relative_positions=32, pos_att_type=["p2c", "c2p"],
                                norm_rel_ebd="layer_norm", share_att_key=True,
                                position_biased_input=False)
    return _classifier(hf.DebertaV2ForSequenceClassification, config)


def modernbert():
    torch.manual_seed(0)
    # Alternating local (8-token window, shorter than the sequence) and global attention.
    config = hf.ModernBertConfig(**_BERT, local_attention=8,
                                 layer_types=["full_attention", "sliding_attention"],
                                 pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                 cls_token_id=1, sep_token_id=2)
    return _classifier(hf.ModernBertForSequenceClassification, config)


def mpnet():
    torch.manual_seed(0)
    # Keep the default 32 relative-position buckets: the bucketing code hard-codes 32.
    config = hf.MPNetConfig(**_BERT)
    return _classifier(hf.MPNetForSequenceClassification, config)


def mobilebert():
    torch.manual_seed(0)
    # Bottlenecked layers: 64 wide between blocks, 32 inside, two stacked FFNs per layer.
    config = hf.MobileBertConfig(vocab_size=VOCAB, hidden_size=64, embedding_size=32,
                                 true_hidden_size=32, intra_bottleneck_size=32,
                                 num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, num_feedforward_networks=2,
                                 max_position_embeddings=64)
    return _classifier(hf.MobileBertForSequenceClassification, config)


def convbert():
    torch.manual_seed(0)
    config = hf.ConvBertConfig(**_BERT, embedding_size=32, head_ratio=2, conv_kernel_size=5)
    return _classifier(hf.ConvBertForSequenceClassification, config)


def roformer():
    torch.manual_seed(0)
    config = hf.RoFormerConfig(**_BERT, embedding_size=32, rotary_value=False)
    return _classifier(hf.RoFormerForSequenceClassification, config)


def squeezebert():
    torch.manual_seed(0)
    # Grouped 1x1 convolutions in place of the Q/K/V and feed-forward linears.
    config = hf.SqueezeBertConfig(**_BERT, embedding_size=32, q_groups=2, k_groups=2,
                                  v_groups=2, intermediate_groups=2, output_groups=2)
    return _classifier(hf.SqueezeBertForSequenceClassification, config)


def funnel():
    torch.manual_seed(0)
    # Two blocks of one layer, the sequence pooled 16 -> 8 between them.
    config = hf.FunnelConfig(vocab_size=VOCAB, block_sizes=[1, 1], d_model=32, n_head=2,
                             d_head=16, d_inner=64, num_decoder_layers=1)
    return _classifier(hf.FunnelForSequenceClassification, config)


def fnet():
    torch.manual_seed(0)
    # Token mixing by a 2-D FFT (torch.fft.fftn, complex intermediates) instead of attention.
    config = hf.FNetConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                           intermediate_size=64, max_position_embeddings=64)
    return _classifier(hf.FNetForSequenceClassification, config)
