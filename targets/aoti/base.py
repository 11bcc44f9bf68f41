"""The AOTInductor base shared by ``cpu`` and ``cuda``: a whole partition becomes one ``.pt2``.

AOTInductor compiles every ATen op: through an Inductor lowering into generated
C++/Triton code, or as a call to the ATen kernel from inside the library. The
support table reports which of the two each op gets.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from passes.base import Pass
from passes.cleanup.empty_concat import DropEmptyConcatOperands
from passes.fusion.merge_linears import MergeParallelLinears
from passes.graph.ops import is_custom_op
from passes.graph.torch_warnings import quiet_inductor_int8_lowering
from passes.quantize.quantize_weight_only import QuantizeWeightOnly
from runtime.executors.aoti import AotiMeta
from runtime.executors.torch_fallback import has_dynamic_inputs
from targets.base import (
    ABSENT,
    OK,
    PROBLEM,
    Availability,
    Check,
    Lowered,
    LowerOptions,
    Support,
    Target,
    base_requirements,
    pipeline,
)
from targets.facets import Generation, Packaging, Tooling
from targets.errors import LoweringError, TargetOptionError
from targets.aoti.card import AotiOptions, compiler_here
from targets.aoti.folded_weights import folded_int8_note, int8_dequantizes_folded
from targets.aoti.passes.attention_store import stored_outputs
from targets.reproducible import (
    canonical_mkldnn_metadata,
    mkldnn_md_layout_known,
    normalize_package,
)
from targets.toolchain import TIMED_OUT, choose_cxx, compiler_stand_in

log = logging.getLogger(__name__)

PACKAGE_NAME = "model.pt2"


def _is_python_custom_op(op) -> bool:
    """A custom op with a Python kernel only; a ``triton_op`` (its Triton kernels traced
    and compiled by Inductor) is not one."""
    from torch._library.custom_ops import OPDEFS
    from torch._library.triton import triton_ops_to_kernels

    return is_custom_op(op) and op.name() in OPDEFS and op.name() not in triton_ops_to_kernels


def package_tensors(package: Path, program: ExportedProgram) -> dict[str, torch.Tensor]:
    """The tensors a package compiled without its constants asks for, by the names it asks
    for them: the program's state_dict and constants keys, and constants Inductor made
    itself (a lowering's scalar, like the group size of ATen's int4 CPU GEMM), read from
    the package's own on-disk copy (``package_constants_on_disk_format``)."""
    loader = torch._C._aoti.AOTIModelPackageLoader(str(package), "model", False, 1, -1)
    wanted = set(loader.get_constant_fqns())
    del loader
    tensors = {**program.state_dict, **program.constants}
    made = _packaged_constants(package, wanted - set(tensors))
    missing = sorted(wanted - set(tensors) - set(made))
    if missing:
        raise LoweringError(f"the package asks for constants the program does not hold: "
                            f"{', '.join(missing[:5])}", nodes=[], movable=False)
    return {name: (tensors[name] if name in tensors else made[name]).detach()
            for name in sorted(wanted)}


def _packaged_constants(package: Path, names: set[str]) -> dict[str, torch.Tensor]:
    """``names`` as the package's pickled copies hold them (``weights_config.json`` maps a
    name to its file under data/weights/)."""
    if not names:
        return {}
    with zipfile.ZipFile(package) as zf:
        files = zf.namelist()
        configs = [f for f in files if f.endswith("/weights_config.json")]
        where = json.loads(zf.read(configs[0])) if configs else {}
        found = {}
        for name in sorted(names & set(where)):
            entry = next(f for f in files if f.endswith(f"/data/weights/{where[name][0]}"))
            found[name] = torch.load(io.BytesIO(zf.read(entry)), weights_only=True)
    return found


def has_data_dependent_sizes(program: ExportedProgram) -> bool:
    """Whether ``program`` reads a size or an index from a tensor's value (``.item()``, a
    ``nonzero``): symbols torch.export knows no example value of."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    return any(free_unbacked_symbols(node.meta.get("val")) for node in program.graph.nodes
               if node.meta.get("val") is not None)


def _own_metadata() -> contextlib.AbstractContextManager:
    """Inductor writes each package's device and ISA into the dict of its setting
    ``aot_inductor.metadata`` itself, in place: a copy while we compile, so the caller's
    setting (and a later build's package, for another device) keeps none of ours."""
    metadata = dict(torch._inductor.config.aot_inductor.metadata)
    return torch._inductor.config.patch({"aot_inductor.metadata": metadata})


def _jsonable(configs: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in configs.items()}


class AotiGeneration(Generation):
    def shares_weights(self, options: LowerOptions) -> bool:
        """Not for PT2E int8 recipes: Inductor turns their dequantize + linear into oneDNN
        int8 GEMMs only while freezing, which packs the weights into the library. Shared
        (unfrozen), int8-dynamic decode ran at half fp32's speed; frozen, each entry
        point carries its own int8 copy."""
        return options.quantize is None or options.quantize in QuantizeWeightOnly.recipes


@dataclass(frozen=True)
class AotiPackaging(Packaging):
    build_packages: tuple[tuple[str, str], ...] = (("torchao", "quant"),)  # --quantize recipes
    build_modules: tuple[str, ...] = ("torch._inductor.compile_fx", "torch._inductor.lowering")

    def nondeterminism(self, options: LowerOptions) -> list[str]:
        # Measured (tests/targets/aoti/test_reproducible.py): cold or warm, one Inductor cache directory
        # gives the same bytes on CPU, whatever --out is; another cache directory path
        # changes the kernel source's name and the .so's debug strings. On a GPU a cold
        # cache renumbered arrays in the generated cuda wrapper.
        found = ["the library embeds Inductor's cache directory path "
                 "(TORCHINDUCTOR_CACHE_DIR; default /tmp/torchinductor_<user>) and the "
                 "compiler's include paths: builds match byte for byte where those match"]
        if not mkldnn_md_layout_known():
            found.append("oneDNN-prepacked weights: this torch's descriptor layout is not the "
                         "one checked, so their uninitialised padding bytes are kept")
        if options.target_as(AotiOptions).autotune:
            found.append("--autotune: Inductor keeps the kernels that timed fastest here")
        return found


@dataclass(frozen=True)
class AotiTooling(Tooling):
    colour: str = "#2f9e44"

    def doctor_checks(self) -> list[Check]:
        """The compiler probe the build itself uses (choose_cxx), so they never disagree."""
        choice = choose_cxx()
        name = "c++ compiler"
        if choice.compiler is None:
            return [Check(name, PROBLEM, choice.note,
                          "install g++ or set CXX to a compiler that links libstdc++ "
                          "dynamically (e.g. CXX=/usr/bin/g++); AOTInductor needs it")]
        if choice.switched:  # builds work (the build switches too); say how to be explicit
            compiler = Check(name, OK, choice.note, f"the build uses {choice.compiler} itself; "
                                                    f"set CXX={choice.compiler} to say so")
        else:
            compiler = Check(name, OK, choice.note)
        if shutil.which("timeout"):
            timeout = Check("timeout", OK, "coreutils timeout: --compile-timeout works")
        else:
            timeout = Check("timeout", PROBLEM, "no `timeout` command: a hung compiler hangs "
                            "the build", "install coreutils")
        if shutil.which("ccache"):
            cache = Check("ccache", OK, "a rebuild of the same code skips its C++ compile "
                          "(CCACHE_DISABLE=1 turns it off)")
        else:
            cache = Check("ccache", ABSENT, "every build compiles its C++ afresh",
                          "install ccache for faster rebuilds (optional)")
        return [compiler, timeout, cache]


class AOTInductorTarget(Target):
    backend = "aoti"
    Options = AotiOptions
    generation = AotiGeneration()
    packaging = AotiPackaging()
    tooling = AotiTooling()

    def supports(self, node: Node) -> Support:
        from torch._inductor.decomposition import select_decomp_table
        from torch._inductor.lowering import fallbacks, lowerings

        op = node.target
        if _is_python_custom_op(op):
            return Support(False, f"custom op {op.name()} has only a Python kernel; compiled "
                                  "AOTInductor code can call ATen and C++-registered kernels")
        if op in lowerings and op not in fallbacks:
            return Support(True, "Inductor lowering: compiled into generated code")
        overload_packet = getattr(op, "overloadpacket", None)
        if op in select_decomp_table() or overload_packet in select_decomp_table():
            return Support(True, "decomposed by Inductor into ops it compiles or calls")
        return Support(True, "ATen kernel called from inside the compiled library")

    def availability(self) -> Availability:
        return Availability(*compiler_here())

    def default_passes(self, options: LowerOptions) -> list[Pass]:
        # Inductor folds batch norm, matches attention and fuses pointwise ops on its own;
        # it does not merge matmuls that read one input. Merged, a decoder's q/k/v and
        # gate/up projections are 2 GEMMs instead of 5.
        quantize = self.quantization.quantize_pass(options, self.device)
        passes = pipeline(options, quantize, fusions=(MergeParallelLinears,))
        # not a fusion: Inductor's CPU cat mislaid such a cat's output (empty_concat.py)
        return [passes[0], DropEmptyConcatOperands(), *passes[1:]]

    def inductor_configs(self, options: LowerOptions, dynamic: bool = False,
                         data_sizes: bool = False) -> dict:
        """Freezing folds weights into constants and lets Inductor prepack them (faster
        CNNs on the CPU). The compiler is the one choose_cxx() vetted (a
        statically linked libstdc++ crashes on load). ``dynamic``: whether the program's
        inputs have dims of no fixed size; ``data_sizes``: whether it reads sizes from
        tensor values (``has_data_dependent_sizes``)."""
        # size_asserts: debug checks that run only under an environment variable, and
        # whose messages embed Python object addresses, so the library differed per build.
        aoti: AotiOptions = self.own_options(options)
        compiler = compiler_stand_in(self._compiler(), aoti.compile_timeout_s)
        configs: dict = {"freezing": True, "cpp.cxx": (None, compiler), "size_asserts": False}
        if hasattr(torch._inductor.config.aot_inductor, "precompile_headers"):
            # A precompiled header costs more to compile than it saves on the one library
            # a build makes (figures: docs/design-notes.md, "AOTInductor compile time").
            configs["aot_inductor.precompile_headers"] = False
        if aoti.autotune:
            configs["max_autotune"] = True
        if options.deterministic:
            configs["deterministic"] = True  # Inductor: no on-device benchmarking
        if options.shared_weights:
            # The weights stay out of the library, as the program's own tensors by name, so
            # the runtime can hand one copy to several packages (load_constants,
            # user_managed). Freezing would fold them into new, per-package constants.
            # A copy on disk too: the only place the values of constants Inductor makes
            # itself exist (package_tensors); normalize_package drops it after.
            configs.update({"freezing": False, "aot_inductor.package_constants_in_so": False,
                            "aot_inductor.package_constants_on_disk_format": "pickle_weights"})
        return configs

    def _compiler(self) -> str:
        choice = choose_cxx()
        if choice.compiler is None:
            raise TargetOptionError(f"no usable C++ compiler for '{self.name}': {choice.note}",
                                    hint="set CXX=/usr/bin/g++ (or another compiler that "
                                         "links libstdc++ dynamically)")
        return choice.compiler

    def lowering_fixes(self, options: LowerOptions) -> contextlib.AbstractContextManager:
        """Corrections to Inductor while this target compiles (none here)."""
        return contextlib.nullcontext()

    def lower(self, program: ExportedProgram, options: LowerOptions) -> Lowered:
        configs = self.inductor_configs(options, dynamic=has_dynamic_inputs(program),
                                        data_sizes=has_data_dependent_sizes(program))
        package = options.work_dir / PACKAGE_NAME
        start = time.perf_counter()
        try:
            # Also patched globally: packaging reads some settings (the CPU ISA
            # label) outside the compile step that inductor_configs covers. Under
            # no_grad: with grad mode on, freezing skipped the int8 weight-prepack and
            # qlinear fusions, leaving PT2E models as dequantize + float GEMM (slower
            # than fp32; pytorch/ao#4566).
            with torch.no_grad(), torch._inductor.config.patch(configs), \
                    _own_metadata(), canonical_mkldnn_metadata(), \
                    self.lowering_fixes(options), int8_dequantizes_folded() as folded, \
                    quiet_inductor_int8_lowering():
                torch._inductor.aoti_compile_and_package(
                    program, package_path=str(package), inductor_configs=configs)
        except Exception as exc:  # compiler errors come in many types; keep the full text
            raise self._lowering_error(exc, options) from exc
        weights = package_tensors(package, program) if options.shared_weights else {}
        normalize_package(package)
        seconds = time.perf_counter() - start
        log.info("AOTInductor compiled %s in %.1f s", package, seconds)
        meta = AotiMeta(package=PACKAGE_NAME, inductor_configs=_jsonable(configs),
                        compiler=choose_cxx().note,
                        stored_outputs=stored_outputs(program) or None)
        notes = [choose_cxx().note] if choose_cxx().switched else []
        notes += folded_int8_note(folded)
        return Lowered(files={PACKAGE_NAME: package}, meta=meta.to_json(),
                       requirements=self.requirements(options), notes=notes,
                       seconds={"compile_seconds": round(seconds, 2)},
                       weights=weights)

    def requirements(self, options: LowerOptions):
        return base_requirements()

    def _lowering_error(self, exc: Exception, options: LowerOptions) -> LoweringError:
        """Not movable: a hung or crashing compiler, or a bad toolchain, is no reason to
        move the model's ops to the CPU fallback; the build stops and names the log."""
        what = f"AOTInductor failed to compile the program for '{self.name}'"
        summary = None
        if TIMED_OUT in str(exc):
            limit = self.own_options(options).compile_timeout_s
            summary = lambda _: f"the C++ compiler did not finish within --compile-timeout {limit} s"  # noqa: E731
        toolchain = summary is not None or any(
            type(e).__name__ in ("CppCompileError", "CalledProcessError", "FileNotFoundError")
            for e in _chain(exc))
        return LoweringError.from_exception(
            exc, what, target=self.name, log_dir=options.log_dir or Path(tempfile.gettempdir()),
            movable=False, summary=summary, details=[],
            hint="read the log; run with --debug for the traceback; check that a C++ compiler "
                 "works (`exporter targets`)" if toolchain else
                 f"Inductor (torch {torch.__version__}) failed on this graph before any C++ "
                 "was compiled: a limit of torch's compiler, not of your toolchain; the log "
                 "holds its traceback; try --target onnx, or another torch version")


def _chain(exc: BaseException | None):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__
