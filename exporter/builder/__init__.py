"""The build: the stage list (pipeline), placement, lowering, quantization recipes."""
