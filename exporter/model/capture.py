"""Capture a model with torch.export and read its signature (names, dtypes, dynamic bounds)."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, TensorArgument
from torch.export._tree_utils import reorder_kwargs
from torch.utils._pytree import GetAttrKey, MappingKey, SequenceKey, tree_flatten_with_path

from exporter.model.dynamic import DynamicDim, apply_dynamic
from exporter.errors import ExportFailedError, UserInputError
from exporter.model.export_errors import explain_export_failure
from exporter.model.finite_guards import repair_finiteness_guards
from exporter.model.forward_contract import check_call, unregistered_output
from exporter.model.given_module import inputs_of_its_own
from exporter.model.spec import ModelSpec
from passes.graph.rewrite import module_path, set_module_path
from runtime.format.dtypes import name_of
from runtime.format.manifest import Dim, Signature, TensorSpec
from runtime.program.flat_inputs import FlatInputs, flatten_inputs
from runtime.program.outputs import encode_tree

log = logging.getLogger(__name__)


@dataclass
class Captured:
    program: ExportedProgram
    signature: Signature
    dynamic_shapes: Any  # what was passed to torch.export
    inputs: FlatInputs


def capture(spec: ModelSpec, dynamic: list[DynamicDim], device: str) -> Captured:
    # in place: a model the build loaded frees its host copy; a caller's module is put
    # back by exporter/api.py's left_as_given, with no second copy of its weights
    module = spec.module.to(device)
    args, kwargs = inputs_of_its_own((spec.args, spec.kwargs), device)
    check_call(module, args, kwargs)
    dynamic_shapes = apply_dynamic(module, args, kwargs, spec.dynamic_shapes, dynamic,
                                   spec.groups)
    # On failure torch.export prints the partial graph straight to stderr; our error
    # paragraph replaces it, and --verbose still shows it through the log.
    torch_stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(torch_stderr), _fake_tensor_errors_to(torch_stderr), \
                repair_finiteness_guards():
            program = torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes,
                                          strict=False)
    except Exception as exc:  # torch.export raises many unrelated types; all become one paragraph
        log.debug("torch.export printed:\n%s", torch_stderr.getvalue())
        raise (unregistered_output(exc)
               or explain_export_failure(exc, spec.origin_file)) from exc
    sys.stderr.write(torch_stderr.getvalue())
    _paths_from_user_model(program, spec.module)
    with torch.no_grad():
        eager_out = module(*args, **kwargs)
    signature = read_signature(program, eager_out, _dim_names(dynamic_shapes, module, args, kwargs),
                               spec.output_names)
    inputs = flatten_inputs(args, reorder_kwargs(kwargs, program.call_spec.in_spec))
    if len(inputs.tensors) != len(signature.inputs):
        raise ExportFailedError(
            f"the model's {len(inputs.tensors)} input tensors do not map onto the "
            f"{len(signature.inputs)} inputs of the captured program",
            hint="pass each tensor to forward() once, as its own argument")
    return Captured(program, signature, dynamic_shapes, inputs)


@contextlib.contextmanager
def _fake_tensor_errors_to(stream: io.StringIO):
    """FakeTensor logs an op that fails under tracing (its traceback, ~25 lines) through
    a handler that writes to the real stderr, before torch.export raises: send it where
    the rest of torch.export's output goes (our error paragraph names the failure)."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    kept = (logger.handlers, logger.propagate)  # torch gives it a stderr handler of its own
    logger.handlers, logger.propagate = [logging.StreamHandler(stream)], False
    try:
        yield
    finally:
        logger.handlers, logger.propagate = kept


def _paths_from_user_model(program: ExportedProgram, module: torch.nn.Module) -> None:
    """Module paths as the user's model names them ("model.layers.0.mlp", as its
    named_modules() does): without the attributes our wrappers hold it under (hf_spec's
    TextOutput, exporter/lm's, CastModel), which each name in ``user_model_attribute``."""
    prefix = ""
    while attribute := getattr(type(module), "user_model_attribute", None):
        prefix, module = f"{prefix}{attribute}.", getattr(module, attribute)
    if prefix:
        for node in program.graph.nodes:
            path = module_path(node)
            if f"{path}.".startswith(prefix):
                set_module_path(node, path[len(prefix):])


def read_signature(program: ExportedProgram, eager_out: Any, dim_names: dict,
                   names: tuple[str, ...] | None = None) -> Signature:
    """``names``: the outputs' names where the spec knows better than the structure does
    (a bare tensor would be 'output'; the hf: loader knows it is 'logits')."""
    symbols = _SymbolNamer(program, dim_names)
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    inputs = []
    for spec in program.graph_signature.input_specs:
        if spec.kind != InputKind.USER_INPUT:
            continue
        if not isinstance(spec.arg, TensorArgument):
            continue  # ints/None baked in as constants at capture
        val = placeholders[spec.arg.name].meta["val"]
        inputs.append(TensorSpec(spec.arg.name, name_of(val), symbols.shape(val, spec.arg.name)))
    outputs = _output_specs(program, eager_out, symbols, names)
    _, out_spec = torch.utils._pytree.tree_flatten(eager_out)
    return Signature(tuple(inputs), tuple(outputs), encode_tree(out_spec))


def _output_specs(program: ExportedProgram, eager_out: Any, symbols: "_SymbolNamer",
                  given: tuple[str, ...] | None) -> list[TensorSpec]:
    paths = [path for path, _ in tree_flatten_with_path(eager_out)[0]]
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    values = list(output_node.args[0])
    n_user = len(program.graph_signature.user_outputs)
    values = values[len(values) - n_user:]  # leading entries are buffer mutations
    names = list(given) if given and len(given) == len(paths) else output_names(paths)
    specs = []
    for name, value in zip(names, values):
        if not isinstance(value, torch.fx.Node) or not isinstance(value.meta.get("val"),
                                                                   torch.Tensor):
            raise ExportFailedError(f"model output '{name}' is not a tensor ({value!r})",
                                    hint="return only tensors (in tuples, lists or dicts)")
        val = value.meta["val"]
        specs.append(TensorSpec(name, name_of(val), symbols.shape(val, name)))
    return specs


def output_names(paths: list[tuple]) -> list[str]:
    """Readable, unique names from pytree key paths: 'logits', 'output_0', 'hidden.1'."""
    if paths == [()]:
        return ["output"]
    names = []
    for path in paths:
        parts = []
        for key in path:
            if isinstance(key, MappingKey):
                parts.append(str(key.key))
            elif isinstance(key, SequenceKey):
                parts.append(str(key.idx) if parts else f"output_{key.idx}")
            elif isinstance(key, GetAttrKey):
                parts.append(key.name)
            else:
                parts.append(re.sub(r"\W+", "", str(key)) or "x")
        names.append(".".join(parts))
    if len(set(names)) != len(names):  # e.g. dict keys '0' and tuple index 0
        names = [f"output_{i}" for i in range(len(names))]
    return names


def _dim_names(dynamic_shapes: Any, module, args, kwargs) -> dict[tuple[str, int], str]:
    """(input name, axis) -> the user's Dim name, so symbols read 'batch' rather than 's77'."""
    if not dynamic_shapes:
        return {}
    import inspect
    names = list(inspect.signature(module.forward).bind(*args, **kwargs).arguments)
    named = dynamic_shapes if isinstance(dynamic_shapes, dict) else dict(zip(names,
                                                                             dynamic_shapes))
    result = {}
    for name, dims in named.items():
        items = dims.items() if isinstance(dims, dict) else enumerate(dims or ())
        for axis, dim in items:
            if getattr(dim, "__name__", None):
                result[(name, int(axis))] = dim.__name__
    return result


class _SymbolNamer:
    """Turns SymInt dims into manifest Dims with bounds from the program's range constraints."""

    def __init__(self, program: ExportedProgram, dim_names: dict) -> None:
        self.ranges = program.range_constraints
        self.dim_names = dim_names
        self.names: dict[Any, str] = {}

    def shape(self, val: torch.Tensor, owner: str) -> tuple[Dim, ...]:
        return tuple(self._dim(size, owner, axis) for axis, size in enumerate(val.shape))

    def _dim(self, size: Any, owner: str, axis: int) -> Dim:
        if isinstance(size, int):
            return Dim(size=size)
        expr = size.node.expr
        if expr.is_number:
            return Dim(size=int(expr))
        if expr not in self.names:
            self.names[expr] = self.dim_names.get((owner, axis)) or f"{owner}_{axis}"
        lo, hi = self._bounds(expr, owner, axis)
        return Dim(symbol=self.names[expr], min=lo, max=hi)

    def _bounds(self, expr: Any, owner: str, axis: int) -> tuple[int, int]:
        if expr in self.ranges:
            vr = self.ranges[expr]
        else:  # a derived dim (e.g. 2*s0): bound it from its free symbols' ranges
            from torch.utils._sympy.value_ranges import bound_sympy
            vr = bound_sympy(expr, {s: self.ranges[s] for s in expr.free_symbols
                                    if s in self.ranges})
        if not vr.upper.is_finite:
            raise UserInputError(
                f"dynamic dim {axis} of '{owner}' has no upper bound",
                hint=f"give one, e.g. Dim('batch', min=1, max=64) or --dynamic {owner}:{axis}=1..64;"
                     " bounds let the runtime check inputs and the build validate both ends")
        return int(vr.lower), int(vr.upper)
