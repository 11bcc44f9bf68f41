"""Target ``tvm``: each delegated partition through Apache TVM Relax, run by the Relax VM.

Import with ``relax.frontend.torch.from_exported_program``; schedule without tuning
(targets/tvm/schedule.py) or with MetaSchedule (``--tune N``); compile with
``tvm.compile`` for ``--tvm-target`` (default: LLVM for the ``--cpu-isa`` level,
so the artifact needs known cpuinfo flags, as on target ``cpu``). The partition
folder holds the exported library and its weights as safetensors.

Op support is TVM's own converter table, read at run time, so it follows the
installed TVM. A partition TVM fails to compile is reported by partition and op
(``LoweringError.nodes``) so the build can move those ops to the CPU fallback.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import logging
import time
from dataclasses import dataclass

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from passes.base import Pass
from passes.cleanup.decompose import Decompose
from passes.cleanup.empty_concat import DropEmptyConcatOperands
from passes.graph.ops import is_custom_op
from runtime.executors.tvm import TvmMeta
from runtime.format.manifest import Partition, Requirements
from runtime.format.weights import read_index
from targets import cpu_isa
from targets.base import (
    Availability,
    Lowered,
    LowerOptions,
    Support,
    Target,
    base_requirements,
    pipeline,
)
from targets.errors import LoweringError, TargetOptionError
from targets.facets import Packaging, Tooling
from targets.fusion import GRAPH_FUSIONS
from targets.tvm import cross
from targets.card import install_command
from targets.tvm.card import TVM, TvmOptions, llvm_target, tvm_here
from targets.tvm.locate import native_stderr_to_log
from targets.tvm.passes.bool_comparisons import BoolComparisonsAsNumbers
from targets.tvm.passes.true_division import TrueDivisionInFloat
from targets.tvm.passes.wrap_negative_indices import (WrapNegativeIndices,
                                                      negative_select_on_a_dynamic_dim)

log = logging.getLogger(__name__)

LIBRARY_NAME = "model.so"
PARAMS_NAME = "params.safetensors"
# Runtime checks the importer has no converter for; torch.export's decomposition
# (which from_exported_program runs first) keeps them, and they only assert.
_CHECKS = {"_assert_scalar.default", "_assert_tensor_metadata.default",
           "sym_constrain_range_for_size.default", "_assert_async.msg"}


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


@dataclass(frozen=True)
class TvmPackaging(Packaging):
    build_packages: tuple[tuple[str, str], ...] = (("apache-tvm", "tvm"),)
    build_modules: tuple[str, ...] = ("targets.tvm.compile",)
    # the executor reads the weights with safetensors (runtime/program/requires.py)
    runtime_extra: tuple[str, tuple[str, ...]] | None = (
        "tvm", ("apache-tvm>=0.27", "apache-tvm-ffi", "safetensors>=0.4"))
    # cross-compiles with LLVM's triple and Debian's cross linker (targets/tvm/cross.py)
    platforms: tuple[str, ...] | None = cross.buildable()

    def runtime_packages(self, partition: Partition) -> dict[str, str | None]:
        return {"apache-tvm": partition.meta.get("tvm"),
                "apache-tvm-ffi": _installed_version("apache-tvm-ffi")}

    def nondeterminism(self, options: LowerOptions) -> list[str]:
        if options.target_as(TvmOptions).tune:
            return ["--tune: MetaSchedule keeps the schedules that measured fastest here"]
        return []


class TvmTarget(Target):
    name, device, backend, description = TVM.name, TVM.device, TVM.backend, TVM.description
    Options = TvmOptions
    packaging = TvmPackaging()
    tooling = Tooling(colour="#7048e8")

    def availability(self) -> Availability:
        return Availability(*tvm_here())

    def supports(self, node: Node) -> Support:
        if not _installed():
            return Support(False, "apache-tvm is not installed")
        op = node.target
        name = getattr(op, "__name__", str(op))
        if isinstance(op, torch._ops.OpOverload):
            # the importer looks ops up without their namespace: be strict here
            if is_custom_op(op):
                return Support(False, f"custom op {op.name()}: TVM's importer has no converter")
            if op.namespace != "aten":
                return Support(False, f"{op.name()}: TVM's importer converts aten ops only")
            if name in _CHECKS:
                return Support(True, "runtime check; dropped on import")
            if negative_select_on_a_dynamic_dim(node):
                return Support(False, "select at a negative index of a dynamic dim: TVM's "
                               "take reads out of bounds there")
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
        # placement judges the graph TVM's importer will convert; an empty operand of a
        # cat (XLM's empty cache) made TVM refuse the Concat of mixed ranks
        return pipeline(options, fusions=GRAPH_FUSIONS) + [
            Decompose(lambda: None, "torch.export default"), DropEmptyConcatOperands(),
            WrapNegativeIndices(), TrueDivisionInFloat(), BoolComparisonsAsNumbers()]

    def lower(self, program: ExportedProgram, options: LowerOptions) -> Lowered:
        if not _installed():
            raise TargetOptionError("target 'tvm' needs apache-tvm", hint=install_command("tvm"))
        from targets.tvm import compile as tvm_compile
        target_string = self._target_string(options)
        tune = self.own_options(options).tune
        compiler = None
        if cross.is_cross(options.platform):
            cross.check_cross_options(options.platform, cpu_isa=options.cpu_isa, tune=tune,
                                      tvm_target=self.own_options(options).tvm_target)
            compiler = cross.cross_compiler(options.platform)
        options.work_dir.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        with native_stderr_to_log(log):
            result = tvm_compile.compile_partition(program, target_string, tune, options,
                                                   error=self._error, cross=bool(compiler))
            library, params = options.work_dir / LIBRARY_NAME, options.work_dir / PARAMS_NAME
            result.save(library, params, compiler)
        meta = TvmMeta(library=LIBRARY_NAME, params=PARAMS_NAME, num_params=result.num_params,
                       tensor_index={"params": read_index(params)}, tvm_target=target_string,
                       platform=options.platform, isa=self._requirements(options).cpu_isa,
                       tvm=result.tvm_version, tune_trials=tune, schedules=result.schedules)
        return Lowered(files={LIBRARY_NAME: library, PARAMS_NAME: params}, meta=meta.to_json(),
                       requirements=self._requirements(options), notes=result.notes,
                       seconds={"compile_seconds": round(time.perf_counter() - start, 2)})

    def _target_string(self, options: LowerOptions) -> str:
        custom = self.own_options(options).tvm_target
        if custom:
            return str(custom)
        if cross.is_cross(options.platform):
            return cross.cross_platform(options.platform).target
        return llvm_target(options.cpu_isa)

    def _requirements(self, options: LowerOptions) -> Requirements:
        base = base_requirements()
        if cross.is_cross(options.platform):
            isa, arch = cross.cross_platform(options.platform), cross.arch_of(options.platform)
            if self.own_options(options).tvm_target:
                return Requirements(arch=arch, torch=base.torch, cpu_isa="tvm-target")
            return Requirements(arch=arch, torch=base.torch, cpu_isa=isa.isa,
                                cpu_flags=isa.cpu_flags)
        if self.own_options(options).tvm_target:  # the user's own -mcpu: we cannot tell its flags
            return Requirements(arch=base.arch, torch=base.torch, cpu_isa="tvm-target")
        level = cpu_isa.resolve(options.cpu_isa)
        if level is None:
            return base
        return Requirements(arch=base.arch, torch=base.torch, cpu_isa=level.name,
                            cpu_flags=level.flags)

    def _error(self, what: str, exc: BaseException, program: ExportedProgram,
               options: LowerOptions, nodes: list[Node]) -> LoweringError:
        partition = options.partition or options.work_dir.name
        return LoweringError.from_exception(
            exc, f"TVM failed to {what} partition '{partition}'", target=self.name,
            partition=partition, log_dir=options.logs, nodes=nodes, summary=_last_message)


def _last_message(text: str) -> str:
    """TVM's errors end with the message, after an indented C++ traceback."""
    return next((line for line in reversed(text.splitlines())
                 if line.strip() and not line.startswith(" ")), "")


def _installed_version(dist: str) -> str | None:
    import importlib.metadata
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
