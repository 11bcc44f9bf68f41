"""Fork servers: a process that imported torch (and whatever else its client names) once
and forks a fresh child per job, each child what ``python -m MODULE ARGS`` would be.

- ``server``: the process itself (``python -m exporter.forking.server``), the child's
  side included;
- ``preload``: importing without making a fork unsafe (CUDA, threads);
- ``client``: starting one, speaking to it, and the pool of them a process keeps.

Both the matrix's warm workers (exporter/matrix/warm.py) and the validation processes
(exporter/validation/process.py) use it. It imports nothing of the other exporter rooms.
"""
