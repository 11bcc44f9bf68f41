"""Triton kernels the cuda target places into a batch-1 decode step as custom ops
(``torch.library.triton_op``: AOTInductor compiles them into the library like its own)."""
