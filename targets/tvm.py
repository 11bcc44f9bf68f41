"""Target ``tvm``: each delegated partition through Apache TVM Relax, run by the Relax VM.

Import with ``relax.frontend.torch.from_exported_program``; schedule without tuning
(targets/tvm_schedule.py) or with MetaSchedule (``--tune N``); compile with
``tvm.compile`` for ``--tvm-target`` (default: LLVM for the ``--cpu-isa`` level,
so the artifact needs known cpuinfo flags, as on target ``cpu``). The partition
folder holds the exported library and its weights as safetensors.

Op support is TVM's own converter table, read at run time, so it follows the
installed TVM. A partition TVM fails to compile is reported by partition and op
(``TvmLoweringError.nodes``) so the build can move those ops to the CPU fallback.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from passes.base import Pass
from passes.decompose import Decompose
from passes.wrap_negative_indices import WrapNegativeIndices
from runtime.manifest import Requirements
from runtime.weights import INDEX_KEY, read_index
from targets import cpu_isa
from targets.base import Availability, Lowered, LowerOptions, Support, Target, pipeline
from targets.errors import LoweringError, TargetOptionError
from targets.fusion import TVM_FUSIONS

log = logging.getLogger(__name__)

LIBRARY_NAME = "model.so"
PARAMS_NAME = "params.safetensors"
# Runtime checks the importer has no converter for; torch.export's decomposition
# (which from_exported_program runs first) keeps them, and they only assert.
_CHECKS = {"_assert_scalar.default", "_assert_tensor_metadata.default",
           "sym_constrain_range_for_size.default", "_assert_async.msg"}


class TvmLoweringError(LoweringError):
    """TVM failed on a partition (exit code 3), naming the nodes it failed on when they
    could be told."""


@functools.cache
def _installed() -> bool:
    return importlib.util.find_spec("tvm") is not None


@functools.cache
def converter_keys() -> frozenset[str]:
    """'add.Tensor', 'conv2d.default', ...: what TVM's ExportedProgram importer converts
    (it looks a node up by ``target.__name__``, without the namespace)."""
    from tvm.relax.frontend.torch.exported_program_translator import (
        ExportedProgramImporter,
    )
    return frozenset(k for k in ExportedProgramImporter().convert_map if isinstance(k, str))


@functools.cache
def _decomposed_by_export() -> frozenset:
    """Ops that from_exported_program's own run_decompositions() replaces before import."""
    return frozenset(torch.export.default_decompositions())


class TvmTarget(Target):
    name = "tvm"
    device = "cpu"
    backend = "tvm"
    description = "Apache TVM Relax per partition (LLVM CPU code), run by the Relax VM"

    def availability(self) -> Availability:
        if not _installed():
            return Availability(False, "apache-tvm is not installed; pip install '.[tvm]'")
        import tvm
        return Availability(True, f"apache-tvm {tvm.__version__}; default target "
                                  f"{self._target_string(LowerOptions(work_dir=Path('.')))}")

    def supports(self, node: Node) -> Support:
        if not _installed():
            return Support(False, "apache-tvm is not installed")
        op = node.target
        name = getattr(op, "__name__", str(op))
        if isinstance(op, torch._ops.OpOverload):
            if op.namespace != "aten":  # the importer ignores namespaces: be strict here
                return Support(False, f"custom op {op.name()}: TVM's importer has no converter")
            if name in _CHECKS:
                return Support(True, "runtime check; dropped on import")
            if name in converter_keys():
                return Support(True, f"TVM converter for {name}")
            # from_exported_program runs run_decompositions() first, which applies the
            # default table and always inlines CompositeImplicit ops (numpy_T, ...).
            if op in _decomposed_by_export() or op._can_decompose():
                return Support(True, "decomposed by torch.export before TVM's import")
            return Support(False, f"TVM's importer has no converter for aten.{name}")
        if name in converter_keys():  # operator.getitem and friends
            return Support(True, f"TVM converter for {name}")
        return Support(False, f"TVM's importer has no converter for {name}")

    def default_passes(self, options: LowerOptions) -> list[Pass]:
        # from_exported_program's own run_decompositions() (the default table) last, so
        # placement judges the graph TVM's importer will convert
        return pipeline(options, fusions=TVM_FUSIONS) + [
            Decompose(lambda: None, "torch.export default"), WrapNegativeIndices()]

    def nondeterminism(self, options: LowerOptions) -> list[str]:
        if int(options.extra.get("tune") or 0):
            return ["--tune: MetaSchedule keeps the schedules that measured fastest here"]
        return []

    def lower(self, program: ExportedProgram, options: LowerOptions) -> Lowered:
        if not _installed():
            raise TargetOptionError("target 'tvm' needs apache-tvm", hint="pip install '.[tvm]'")
        from targets import tvm_compile
        target_string = self._target_string(options)
        tune = int(options.extra.get("tune") or 0)
        options.work_dir.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        with native_stderr_to_log(log):
            result = tvm_compile.compile_partition(program, target_string, tune, options,
                                                   error=self._error)
            library, params = options.work_dir / LIBRARY_NAME, options.work_dir / PARAMS_NAME
            result.save(library, params)
        meta = {"library": LIBRARY_NAME, "params": PARAMS_NAME, "num_params": result.num_params,
                INDEX_KEY: {"params": read_index(params)},
                "tvm_target": target_string, "tvm": result.tvm_version, "tune_trials": tune,
                "schedules": result.schedules, "compile_seconds":
                    round(time.perf_counter() - start, 2)}
        return Lowered(files={LIBRARY_NAME: library, PARAMS_NAME: params}, meta=meta,
                       requirements=self._requirements(options), notes=result.notes)

    def _target_string(self, options: LowerOptions) -> str:
        custom = options.extra.get("tvm_target")
        if custom:
            return str(custom)
        level = cpu_isa.resolve(options.cpu_isa)
        return f"llvm -mcpu={level.march}" if level is not None else "llvm"

    def _requirements(self, options: LowerOptions) -> Requirements:
        base = self.base_requirements()
        if options.extra.get("tvm_target"):  # the user's own -mcpu: we cannot tell its flags
            return Requirements(arch=base.arch, torch=base.torch, cpu_isa="tvm-target")
        level = cpu_isa.resolve(options.cpu_isa)
        if level is None:
            return base
        return Requirements(arch=base.arch, torch=base.torch, cpu_isa=level.name,
                            cpu_flags=level.flags)

    def _error(self, what: str, exc: BaseException, program: ExportedProgram,
               options: LowerOptions, nodes: list[Node]) -> TvmLoweringError:
        partition = options.extra.get("partition") or options.work_dir.name
        text = str(exc).strip()
        first = next((line for line in reversed(text.splitlines())
                      if line.strip() and not line.startswith(" ")), "")[:300]
        log_dir = options.log_dir or options.work_dir
        log_path = Path(log_dir) / f"exporter-tvm-{partition}-{time.strftime('%Y%m%d-%H%M%S')}.log"
        log_path.write_text(f"{type(exc).__name__}: {text}\n")
        details = [f"{n.name}: {n.target}" for n in nodes]
        return TvmLoweringError(
            f"TVM failed to {what} partition '{partition}' ({type(exc).__name__}: {first})",
            where=str(log_path), details=details, nodes=[n.name for n in nodes],
            hint=("the ops listed are moved to the CPU fallback unless --fallback forbid"
                  if nodes else "read the log; --debug shows the traceback"))


@contextlib.contextmanager
def native_stderr_to_log(logger: logging.Logger) -> Iterator[None]:
    """TVM's C++ logging (``Warning: Scope Saving``, ``Fast mode segfaults when...``, a
    dozen lines per partition) writes to file descriptor 2, past Python's logging. Send it
    to the debug log instead (``--verbose`` shows it); errors still arrive as exceptions."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            for line in sink.read().decode(errors="replace").splitlines():
                logger.debug("tvm: %s", line)


def ops_named_in(text: str, program: ExportedProgram) -> list[Node]:
    """Graph nodes whose op TVM names in an error: 'Unsupported function types
    ['cumsum.default']' or a failing PrimFunc called 'cumsum1'."""
    nodes = [n for n in program.graph.nodes if n.op == "call_function"]
    quoted = set(re.findall(r"'([\w.]+)'", text))
    hits = [n for n in nodes if getattr(n.target, "__name__", None) in quoted]
    if hits:
        return hits
    words = {re.sub(r"\d+$", "", w) for w in re.findall(r"[A-Za-z_][A-Za-z_0-9]*", text)}
    return [n for n in nodes if _op_stem(n) in words]


def _op_stem(node: Node) -> str:
    return getattr(node.target, "__name__", "").split(".")[0]
