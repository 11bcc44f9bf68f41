"""A loaded artifact: ``Program`` (torch tensors) and ``ArrayProgram`` (numpy arrays, no
torch), what both share, what an artifact needs installed, and how inputs and outputs are
flattened and nested. Nothing here is imported by the package itself: ``torch_program``
imports torch, and a device without torch imports only ``array_program``."""
