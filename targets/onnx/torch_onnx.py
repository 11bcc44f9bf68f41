"""Calling torch.onnx on a partition: what the onnx target wraps around the call.

Its registry quiet, the program's input guards off, its optimizer's no-op rules exact,
and a report folder for a failure.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch.export import ExportedProgram

from passes.cleanup.decompose import leaves_as_is
from passes.graph.torch_warnings import loggers_quiet, quiet_run_decompositions
from runtime.host import scratch
from targets.base import LowerOptions

REPORT_DIR_PREFIX = "exporter-onnx-"


@contextlib.contextmanager
def quiet_registry():
    """Building torch.onnx's registry warns once per torchvision op when torchvision is
    absent (four lines per partition); models that use no torchvision op don't care. Its
    export decomposes the program too (passes/graph/torch_warnings.py)."""
    with loggers_quiet("torch.onnx._internal.exporter._registration"), \
            quiet_run_decompositions():
        yield


def export(program: ExportedProgram, report_dir: Path, translations: dict):
    """``torch.onnx.export(program, (), dynamo=True, optimize=True, report=True,
    artifacts_dir=report_dir, verbose=False, custom_translation_table=translations)``, as
    its _compat.export_compat makes it for a program, but with one registry per process:
    export_compat rebuilds torch.onnx's registry on every call (0.6-1 CPU s); the export
    only reads it (_core.export, _dispatching.dispatch). A torch whose _core.export takes
    other arguments gets torch.onnx.export itself."""
    import numpy as np
    # the optimizer folds constants with onnx's numpy reference ops, where log(0) = -inf and
    # a cast of inf are meant: numpy's RuntimeWarnings there told the user nothing
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return _export(program, report_dir, translations)


def _export(program: ExportedProgram, report_dir: Path, translations: dict):
    from torch.onnx._constants import ONNX_DEFAULT_OPSET
    from torch.onnx._internal.exporter import _core
    if not _takes(_core.export, "registry", "optimize", "opset_version", "artifacts_dir"):
        return torch.onnx.export(program, (), dynamo=True, optimize=True, report=True,
                                 artifacts_dir=report_dir, verbose=False,
                                 custom_translation_table=translations)
    registry = _registry(ONNX_DEFAULT_OPSET, tuple(translations.items()))
    with _decomposed_once(program, registry):
        return _core.export(
            program, (), None, registry=registry, dynamic_shapes={}, report=True,
            artifacts_dir=report_dir, verbose=False, optimize=True,
            opset_version=ONNX_DEFAULT_OPSET)


def _takes(function, *names: str) -> bool:
    return set(names) <= set(inspect.signature(function).parameters)


# The program _core.export may take as already decomposed, in this thread only: its
# decomposition step is patched once (below) and asks this.
_AS_IS = threading.local()


@contextlib.contextmanager
def _decomposed_once(program: ExportedProgram, registry):
    """torch.onnx decomposes the program with its table before translating; the onnx target's
    own passes already ran that table (passes/cleanup/decompose.py), and re-tracing a graph
    it leaves unchanged was half of a tiny language model's export (2.5 of 4.5 CPU s). The
    same ONNX graph comes out, its values named as the program's nodes are. Skipped only
    where nothing is left to decompose (``leaves_as_is``); any other program is decomposed."""
    from torch.onnx._internal.exporter import _fx_passes
    decompose = getattr(_fx_passes, "decompose_with_registry", None)
    if decompose is None or not hasattr(program, "_update"):  # another torch: as it is
        yield
        return
    if not getattr(decompose, "_exporter_as_is", False):
        _fx_passes.decompose_with_registry = _unless_decomposed(decompose)
    translated, table = decomposition_table(registry)
    _AS_IS.program = program if leaves_as_is(program, table, translated) else None
    try:
        yield
    finally:
        _AS_IS.program = None


def _unless_decomposed(decompose):
    @functools.wraps(decompose)
    def decompose_with_registry(program, registry):
        if program is getattr(_AS_IS, "program", None):
            return _own_graph(program)
        return decompose(program, registry)
    decompose_with_registry._exporter_as_is = True
    return decompose_with_registry


def _own_graph(program: ExportedProgram) -> ExportedProgram:
    """``program`` with a copy of its graph (weights and node values shared): torch.onnx
    inserts casts into the graph it decomposed and drops its checks, in place, and the
    builder plans the caller's program again if this partition fails."""
    graph = copy.deepcopy(program.graph)
    # the copy's namespace renames a node named as a builtin ("input" -> "input_1"), and
    # the signature names the program's own nodes
    for mine, theirs in zip(graph.nodes, program.graph.nodes, strict=True):
        mine.name = theirs.name
    module = torch.fx.GraphModule(program.graph_module, graph)
    return program._update(module, program.graph_signature)


@functools.cache
def decomposition_table(registry) -> tuple[frozenset, dict]:
    """The ops ``registry`` translates and the table torch.onnx decomposes the rest with
    (as its _fx_passes.decompose_with_registry builds it)."""
    from torch.onnx._internal.exporter import _decomp
    translated = frozenset(_decomp.get_onnx_implemented_overloads(registry))
    return translated, _decomp.create_onnx_friendly_decomposition_table(set(translated))


@functools.cache
def _registry(opset: int, translations: tuple):
    from torch.onnx._internal.exporter import _constants, _registration
    registry = _registration.ONNXRegistry.from_torchlib(
        opset_version=max(opset, _constants.TORCHLIB_OPSET))
    for op, translation in translations:
        registry.register_op(op, translation, is_complex=False)
    return registry


@contextlib.contextmanager
def without_input_guards(program: ExportedProgram):
    """torch.onnx decomposes ``program.module()``, which calls a ``_guards_fn`` checking the
    inputs where the program keeps example inputs; on a re-captured partition with a
    derived dim it failed ("'NoneType' object has no attribute 'size'": a mixture of
    experts' partitions moved to the CPU fallback). The ONNX graph needs no input guards."""
    kept = program.example_inputs
    program.example_inputs = None
    try:
        yield
    finally:
        program.example_inputs = kept


@contextlib.contextmanager
def exact_no_op_rules():
    """torch.onnx's optimizer (onnxscript, ``optimize=True``) drops ``x + c``, ``x - c``,
    ``x * c`` and ``x / c`` as no-ops where ``c`` is within 1e-8 (absolute) or 1e-5
    (relative) of 0 or 1. An epsilon is not a no-op: AFMoE's router divides by
    ``sum + 1e-20``, and with the add gone a token whose expert scores all underflowed got
    0 / 0 = NaN logits on onnx (tests/targets/onnx/test_onnx_target.py keeps such an add). For the
    export, the constants of those rules match exactly."""
    constants = list(_no_op_constants())
    saved = [(c, c._rel_tol, c._abs_tol) for c in constants]
    for constant in constants:
        constant._rel_tol = constant._abs_tol = 0.0
    try:
        yield
    finally:
        for constant, rel, absolute in saved:
            constant._rel_tol, constant._abs_tol = rel, absolute


def _no_op_constants():
    """The scalar constant patterns (``_pattern_ir.Constant``) inside onnxscript's no-op
    rules, found by walking the rules' attributes (their layout is onnxscript's own)."""
    try:
        from onnxscript.rewriter import _pattern_ir
        from onnxscript.rewriter.rules.common import _no_op
    except ImportError:  # another onnxscript: its test in tests/targets/onnx/test_onnx_target.py says
        return
    seen: set[int] = set()
    stack = list(_no_op.rules.rules)
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, str | int | float | bytes | type(None)):
            continue
        seen.add(id(item))
        if isinstance(item, _pattern_ir.Constant):
            yield item
        elif isinstance(item, list | tuple | set):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif type(item).__module__.startswith("onnxscript.rewriter"):
            stack.extend(vars(item).values() if hasattr(item, "__dict__") else ())
            stack.extend(getattr(item, slot, None) for slot in getattr(type(item), "__slots__", ()))


def new_report_dir(options: LowerOptions) -> Path:
    parent = options.log_dir or Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    return scratch.make_dir(f"{REPORT_DIR_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-", parent)
