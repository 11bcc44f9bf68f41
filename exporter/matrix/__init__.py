"""``exporter matrix``: many builds as one table (models x target recipes), run here or on
a Ray cluster, with a content-addressed build cache.

- ``spec_file``: the MATRIX.toml format, read into cells (each a BuildSettings);
- ``cell``: one cell in its own processes (``exporter build --json``, then bench);
- ``cache``: the key of a cell and the store of settled outcomes and artifacts;
- ``executors``: local (a pool on this machine) and Ray;
- ``runner``: the driver; ``results`` and ``tables``: matrix.json/.csv/.html, markdown.

Python callers: ``exporter.matrix.runner.run_matrix(path, out, ...)``.
"""
