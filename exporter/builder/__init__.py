"""The build: the one pipeline, the stages its kinds share, the plain kind, placement,
lowering, quantization recipes."""
