"""Passes that simplify a graph without changing what it computes: dead code, no-ops,
empty operands, and the decomposition a target's own exporter applies."""
