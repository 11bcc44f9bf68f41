"""Imported by a warm process in tests/exporter/matrix/test_matrix_warm.py: torch reports a CUDA build
with one GPU in sight, as on a GPU machine (without initializing anything)."""

import torch

torch.cuda._is_compiled = lambda: True
torch.cuda.device_count = lambda: 1
