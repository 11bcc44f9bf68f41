"""Rewriting a program through its unlifted module, then capturing it again.

Passes that change weights (fold batch norm into a conv, concatenate Q/K/V, quantize)
are simplest on ``program.module()``, where weights are ``get_attr`` attributes instead of
lifted placeholders with a signature to keep in step; ``recapture`` then exports the
rewritten module with the program's flat inputs and dynamic dims. The cost is one
``torch.export`` per pass that changed something (none for a pass with nothing to do).
"""

from __future__ import annotations

import re

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.dims import export_keeping_dims
from runtime.program.flat_inputs import FlatInputs, flatten_inputs


class _FlatCall(torch.nn.Module):
    """The captured module called with flat tensors, as the program takes them."""

    def __init__(self, inner: torch.nn.Module, inputs: FlatInputs) -> None:
        super().__init__()
        self.inner, self.inputs = inner, inputs

    def forward(self, *flat: torch.Tensor):
        args, kwargs = self.inputs.rebuild(list(flat))
        return self.inner(*args, **kwargs)


def recapture(module: torch.nn.Module, program: ExportedProgram) -> ExportedProgram:
    """Export ``module`` (a rewritten ``program.module()``) with the program's flat
    inputs and the same dynamic dims."""
    inputs = flatten_inputs(*program.example_inputs)
    user_inputs = [n for n in program.graph.nodes if n.op == "placeholder"
                   and n.name in program.graph_signature.user_inputs]
    recaptured = export_keeping_dims(_FlatCall(module, inputs), tuple(inputs.tensors),
                                     user_inputs, program, nest=True)
    keep_source_meta(recaptured, module)
    return recaptured


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def keep_source_meta(program: ExportedProgram, module: torch.fx.GraphModule) -> None:
    """Give each node of ``program`` (a capture of ``module``'s generated code) the source
    metadata of the ``module`` node it came from. Without this every re-captured op's
    stack trace is ``<eval_with_key>.16:13``, and placement tables and errors lose the
    user's file and line. The generated file's line maps to its node through fx's own
    line table (as torch._utils' memory-profiler augmentation reads it)."""
    if not isinstance(module, torch.fx.GraphModule):
        return
    generated = type(module).forward.__code__.co_filename
    lines = getattr(module, "_lineno_map", None) or {}
    start = getattr(module, "_prologue_start", 0)
    sources = list(module.graph.nodes)
    for node in program.graph.nodes:
        trace = node.meta.get("stack_trace") or ""
        ours = [int(line) for path, line in _FRAME.findall(trace) if path == generated]
        index = lines.get(ours[-1] - start) if ours else None
        if index is None or index >= len(sources):
            continue
        # the line, and the module path under a key of our own: nn_module_stack and
        # source_fn_stack steer PT2E quantizers' pattern matching, and the re-capture's
        # own are what they were built against
        if "stack_trace" in sources[index].meta:
            node.meta["stack_trace"] = sources[index].meta["stack_trace"]
        set_module_path(node, module_path(sources[index]))


# The module path a node's op came from, kept across re-captures (whose own
# nn_module_stack is the rewritten GraphModule's, empty) for reports and error messages.
# In the node's "custom" meta: fx's retracing (run_decompositions, torch.onnx's) copies
# that dict to the nodes an op becomes; a key of our own at the top level it drops.
SOURCE_MODULE = "exporter_source_module"


def module_path(node: torch.fx.Node) -> str:
    """The innermost nn.Module that called the op ("model.layers.0.self_attn.q_proj"), or
    "" where none did (the model's own forward)."""
    kept = node.meta.get("custom") or {}
    if SOURCE_MODULE in kept:
        return kept[SOURCE_MODULE]
    stack = node.meta.get("nn_module_stack") or {}
    return list(stack.values())[-1][0] if stack else ""


def set_module_path(node: torch.fx.Node, path: str) -> None:
    node.meta["custom"] = {**(node.meta.get("custom") or {}), SOURCE_MODULE: path}


def attribute(module: torch.fx.GraphModule, node: object) -> torch.Tensor | None:
    """The tensor a ``get_attr`` node reads, or None for anything else."""
    if not (isinstance(node, torch.fx.Node) and node.op == "get_attr"):
        return None
    owner, _, attr = node.target.rpartition(".")
    value = getattr(module.get_submodule(owner) if owner else module, attr, None)
    return value if isinstance(value, torch.Tensor) else None


def replace_calls(module: torch.fx.GraphModule, arguments, function, figure: str) -> dict:
    """Replace every node for which ``arguments(node)`` gives ``(args, kwargs)`` (None:
    leave it) by a call of ``function`` with them, keeping the node's metadata:
    ``{figure: how many}``."""
    replaced = 0
    for node in list(module.graph.nodes):
        found = arguments(node)
        if found is None:
            continue
        with module.graph.inserting_before(node):
            replacement = module.graph.call_function(function, *found)
        replacement.meta = dict(node.meta)
        node.replace_all_uses_with(replacement)
        module.graph.erase_node(node)
        replaced += 1
    module.recompile()
    return {figure: replaced}


def add_constant(module: torch.fx.GraphModule, name: str, value: torch.Tensor,
                 before: torch.fx.Node) -> torch.fx.Node:
    """Register ``value`` under a free name derived from ``name``; a get_attr to it."""
    base, index = name.replace(".", "_"), 0
    while hasattr(module, f"{base}_{index}" if index else base):
        index += 1
    free = f"{base}_{index}" if index else base
    module.register_buffer(free, value.detach())
    with module.graph.inserting_before(before):
        return module.graph.get_attr(free)


def drop_unused_weights(module: torch.fx.GraphModule) -> None:
    """A rewrite that replaces a weight (convert_pt2e's int8 copy, addmm's transposed
    one) leaves the float original registered; re-capture would carry both."""
    module.graph.eliminate_dead_code()
    module.recompile()
    used = {n.target for n in module.graph.nodes if n.op == "get_attr"}
    # remove_duplicate=False: a tied weight (GPT-2's wte and lm_head) has two names, and
    # the unused one would otherwise stay and be exported in float.
    for name, _ in [*module.named_parameters(remove_duplicate=False),
                    *module.named_buffers(remove_duplicate=False)]:
        if name not in used:
            owner_path, _, attr = name.rpartition(".")
            delattr(module.get_submodule(owner_path) if owner_path else module, attr)


def rewrite_and_recapture(program: ExportedProgram, rewrite, figure: str) -> PassResult:
    """Run ``rewrite(module) -> info`` on the unlifted module; re-capture only when
    ``info[figure]`` says something changed, so ``modified`` is honest."""
    module = program.module()
    info = rewrite(module)
    if not info[figure]:
        return PassResult(program, modified=False, info=info)
    drop_unused_weights(module)
    return PassResult(recapture(module, program), modified=True, info=info)
