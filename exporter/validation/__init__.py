"""Proving an artifact: inputs, the accuracy gates, validation and bisect."""
