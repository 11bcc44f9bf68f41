"""Target ``tvm``: Apache TVM Relax per partition, run by the Relax VM (``tvm`` is optional:
only target.py, locate.py and passes/ import without it)."""
