"""Target ``tvm``: Apache TVM Relax per partition, run by the Relax VM (``tvm`` is optional:
only target.py and locate.py import without it)."""
