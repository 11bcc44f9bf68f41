"""Quantization passes (torchao PT2E, weight-only, mixture-of-experts) and the graph
helpers and error measures they share."""
