"""The machine the runtime runs on: its CPU facts, the temporary files it records, the
files it writes whole, and named tensors read from and written to files."""
