"""A one-layer AFMoE decoder whose router scores all underflow to 0 (its gate scaled up): every
token's experts are a tie, which torch.topk and ONNX Runtime's TopK break differently. A
real divergence between eager and an onnx build, for the generation bisect's test
(tests/exporter/lm/test_generation_gate.py): the bisect must name the TopK and its line in transformers."""

import torch


def factory():
    import transformers as tf
    torch.manual_seed(0)
    config = tf.AfmoeConfig(
        vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, num_dense_layers=0,
        num_shared_experts=1, layer_types=["full_attention"], sliding_window=64)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.2)
        for layer in model.model.layers:
            router = getattr(layer.mlp, "router", None)
            if router is not None:
                router.gate.weight.mul_(1000.0)  # sigmoid scores underflow to 0: all tied
    # plain batched matmuls: one ONNX partition an entry point, where the default experts
    # kernel (a custom op with no ONNX translation) split each into five
    model.set_experts_implementation("batched_mm")
    return model
