"""Importing this registers the toy executor kind: what the validation process (and a
device, with ``--preload tests.toy_target.register``) imports to run toy partitions."""

from runtime.executors import register_executor
from tests.toy_target.executor import BACKEND, ToyExecutor

register_executor(BACKEND, ToyExecutor, replace=True)  # replace: a second import is harmless
