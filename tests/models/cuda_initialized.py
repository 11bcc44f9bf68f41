"""Imported by a warm process in tests/exporter/matrix/test_matrix_warm.py: with a GPU in sight
(CUDA_VISIBLE_DEVICES not empty) it leaves torch reporting CUDA as initialized, as
importing transformers.modeling_utils does on a GPU machine (torchao asks for the GPU's
capability); a CPU build of torch cannot do it for real."""

import os

import torch

torch.cuda._is_compiled = lambda: True
if os.environ.get("CUDA_VISIBLE_DEVICES") != "":
    torch.cuda.is_initialized = lambda: True
