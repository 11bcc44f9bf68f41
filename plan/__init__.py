"""Planning over a program that its passes are done with: partitioning it between a
target and the CPU fallback, and laying its tensors out in memory. Not passes: they
split or measure a program, they do not rewrite it (docs/architecture.md)."""
